"""Priorities live (issue 11), small scale: `tokenyard up --tenants FILE` with a tenant policy
that lets a client's declared class be used up to P0, then `tokenyard bench serve` with the
class mix 5/60/30/5 at `--load` × the fleet's capacity. Reports each class's p50 / p95 TTFT
and how many were served, refused or expired (a lost request has no TTFT: its count is beside).

    python -m bench.live_priorities [--workers 2] [--load 2] [--num-prompts 400]
                                    [--input-len 2000] [--output-len 100] [--out FILE.json]

Capacity is the simulator's, on the same fleet and request shape (bench.live_burst.capacity).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench._out import write_result
from bench.live_burst import capacity, start_up, stop_up

TENANTS = '[default]\nceiling = "P0"\n'
"""Every tenant may declare any class (the default policy caps at P1, DESIGN §3.2)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_priorities", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="simulated workers `tokenyard up` starts (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b", help="the simulated workers' latency profile (default: %(default)s)")
    p.add_argument("--load", type=float, default=2.0, help="offered rate ÷ capacity")
    p.add_argument("--num-prompts", type=int, default=400, help="requests sent (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=2000, help="prompt tokens of every request (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=100, help="output tokens of every request (default: %(default)s)")
    p.add_argument("--mix", default="5,60,30,5", help="P0,P1,P2,P3 shares of the requests (default: %(default)s)")
    p.add_argument("--out", default=None, help="write the result as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    cap = capacity(args.workers, args.input_len, args.output_len, args.profile)
    rate = args.load * cap
    print(f"capacity {cap:.1f} req/s (simulator); offered {rate:.1f} req/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tenants = os.path.join(tmp, "tenants.toml")
        with open(tenants, "w") as f:
            f.write(TENANTS)
        creds = os.path.join(tmp, "creds")
        up, url = start_up(args.workers, args.profile, creds, "--tenants", tenants)
        try:
            result = os.path.join(tmp, "result.json")
            subprocess.run([os.path.join(os.path.dirname(sys.executable), "tokenyard"), "bench", "serve",
                            "--target", url, "--num-prompts", str(args.num_prompts), "--input-len",
                            str(args.input_len), "--output-len", str(args.output_len), "--rate", f"{rate:.3f}",
                            "--priority-mix", args.mix, "--no-progress", "--result-json", result], check=True,
                           env={**os.environ, "TOKENYARD_NATS_CREDS": os.path.join(creds, "client.creds")})
            with open(result) as f:
                res = json.load(f)
        finally:
            stop_up(up)
    by = {c: {k: v.get(k) for k in ("completed", "failed", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms")}
          for c, v in res["by_priority"].items()}
    doc = {"capacity_req_s": cap, "rate_req_s": rate, **vars(args), "by_priority": by,
           "errors": res.get("errors"), "output_throughput": res["output_throughput"]}
    print(json.dumps(doc, indent=2))
    write_result(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
