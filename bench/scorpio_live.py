"""SCORPIO live against vLLM's FCFS batching, small scale (seed 003, issue 11): `tokenyard up
--scheduling scorpio|vllm` (real processes, NATS, the default queue and router), then `tokenyard
bench serve` with one class (P1: 5 s TTFT target) at `--load` × the fleet's capacity. Goodput
= requests that got their first token within the TTFT SLO and kept the TPOT SLO, per second
(bench serve's --goodput, over the run's whole duration, drain included; the good requests'
count is beside). The requests name no TPOT SLO, so every one has the fleet's default
(100 ms, shared/slo.DEFAULT_TPOT_SLO_MS), which is what SCORPIO's batch admission holds.

    python -m bench.scorpio_live [--workers 2] [--load 2] [--num-prompts 400]
                                 [--input-len 512] [--output-len 200] [--out FILE.json]

Capacity is the simulator's, on the same fleet and request shape (bench.live_burst.capacity).
A rejected or refused request is not good. Wall-clock: run it at normal priority.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench._out import write_result
from bench.live_burst import capacity, start_up, stop_up

TTFT_SLO_MS, TPOT_SLO_MS = 5000.0, 100.0
KEYS = ("duration", "completed", "failed", "request_goodput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "p99_tpot_ms")


def run_one(scheduling: str, args, rate: float) -> dict[str, Any]:
    creds = tempfile.mkdtemp(prefix="tokenyard-scorpio-")
    from tokenyard.shared.natsutil import free_port

    # a port of its own: another fleet on this machine may hold up's default HTTP port
    up, url = start_up(args.workers, args.profile, creds, "--scheduling", scheduling, "--http-port", str(free_port()))
    try:
        result = os.path.join(creds, "result.json")
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "tokenyard"), "bench", "serve",
                        "--target", url, "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
                        "--output-len", str(args.output_len), "--range-ratio", "0.5", "--rate", f"{rate:.3f}",
                        "--priority-mix", "0,1,0,0", "--goodput", f"ttft:{TTFT_SLO_MS:g}", f"tpot:{TPOT_SLO_MS:g}",
                        "--seed", str(args.seed), "--no-progress", "--result-json", result],
                       check=True, env={**os.environ, "TOKENYARD_NATS_CREDS": os.path.join(creds, "client.creds")})
        with open(result) as f:
            res = json.load(f)
    finally:
        stop_up(up)
    out = {k: res.get(k) for k in KEYS} | {"errors": res.get("errors")}
    out["good"] = round((res.get("request_goodput") or 0.0) * res["duration"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scorpio_live", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--profile", default="a100-llama3-8b")
    p.add_argument("--load", type=float, default=2.0, help="offered rate ÷ capacity")
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default="vllm,scorpio", help="the workers' --scheduling values to run")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    cap = capacity(args.workers, args.input_len, args.output_len, args.profile)
    rate = args.load * cap
    print(f"capacity {cap:.1f} req/s (simulator); offered {rate:.1f} req/s", flush=True)
    runs = {}
    for sched in (x for x in args.policies.split(",") if x):
        runs[sched] = run_one(sched, args, rate)
        print(sched, json.dumps(runs[sched]), flush=True)
    doc: dict[str, Any] = {"capacity_req_s": cap, "rate_req_s": rate, **vars(args), "runs": runs}
    if "vllm" in runs and "scorpio" in runs and runs["vllm"]["request_goodput"]:
        doc["scorpio_over_fcfs"] = runs["scorpio"]["request_goodput"] / runs["vllm"]["request_goodput"]
        doc["good_scorpio_over_fcfs"] = runs["scorpio"]["good"] / max(runs["vllm"]["good"], 1)
        print(f"goodput scorpio ÷ fcfs (vLLM's batching): {doc['scorpio_over_fcfs']:.2f} "
              f"(good requests {runs['scorpio']['good']} vs {runs['vllm']['good']})")
    write_result(args.out, doc, "python -m bench.scorpio_live", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
