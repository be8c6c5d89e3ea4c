"""SCORPIO live against vLLM's FCFS batching, small scale (seed 003, issue 11): `tokenyard up
--scheduling scorpio|vllm` (real processes, NATS, the default queue and router), then `tokenyard
bench serve` with one class (P1: 5 s TTFT target) and the seed's mix of TPOT SLOs (`--tpot-slo-mix`,
default half 50 ms, half 200 ms: each request sends its own `tpot_slo_ms`) at each `--loads` ×
the fleet's capacity. A request is good when its first token came within 5 s and its TPOT met its
own SLO; goodput = good requests per second over the run's whole duration, drain included (the
good requests' count and each SLO group's are beside). A refused or rejected request is not good.

    python -m bench.scorpio_live [--workers 2] [--loads 0.8,1] [--rounds 2] [--num-prompts 400]
                                 [--input-len 512] [--output-len 200] [--tpot-slo-mix 50:0.5,200:0.5]
                                 [--out FILE.json]

Rounds interleave the policies (vllm, scorpio, vllm, scorpio, …) so a change in the machine's load
hits both alike; each round is a fresh fleet. Capacity is the simulator's, on the same fleet and
request shape, with FCFS batching (bench.live_burst.capacity). Wall-clock: run it at normal
priority, under the shared live lock; the load average before and after each run is recorded.
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

TTFT_SLO_MS = 5000.0
KEYS = ("duration", "completed", "failed", "request_goodput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "p99_tpot_ms")
GROUP_KEYS = ("completed", "failed", "request_goodput", "median_ttft_ms", "median_tpot_ms", "p99_tpot_ms")


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
                        "--priority-mix", "0,1,0,0", "--goodput", f"ttft:{TTFT_SLO_MS:g}",
                        "--tpot-slo-mix", args.tpot_slo_mix,
                        "--seed", str(args.seed), "--no-progress", "--result-json", result],
                       check=True, env={**os.environ, "TOKENYARD_NATS_CREDS": os.path.join(creds, "client.creds")})
        with open(result) as f:
            res = json.load(f)
    finally:
        stop_up(up)
    out = {k: res.get(k) for k in KEYS} | {"errors": res.get("errors")}
    out["good"] = round((res.get("request_goodput") or 0.0) * res["duration"])
    out["by_tpot_slo"] = {
        name: {k: b.get(k) for k in GROUP_KEYS} | {"good": round((b.get("request_goodput") or 0.0) * res["duration"])}
        for name, b in (res.get("by_tpot_slo") or {}).items()
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scorpio_live", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="simulated workers `tokenyard up` starts (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b", help="the simulated workers' latency profile (default: %(default)s)")
    p.add_argument("--loads", default="0.8,1", help="offered rates ÷ capacity, comma-separated")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every policy at every load")
    p.add_argument("--num-prompts", type=int, default=400, help="requests per run (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=512,
                   help="prompt tokens per request on average, each between 0.5 and 1.5 times this (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=200,
                   help="output tokens per request on average, each between 0.5 and 1.5 times this (default: %(default)s)")
    p.add_argument("--tpot-slo-mix", default="50:0.5,200:0.5", help="bench serve's --tpot-slo-mix")
    p.add_argument("--seed", type=int, default=0, help="bench serve's seed of the requests (default: %(default)s)")
    p.add_argument("--policies", default="vllm,scorpio", help="the workers' --scheduling values to run")
    p.add_argument("--out", default=None, help="write the result as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    cap = capacity(args.workers, args.input_len, args.output_len, args.profile)
    policies = [x for x in args.policies.split(",") if x]
    print(f"capacity {cap:.1f} req/s (simulator, FCFS)", flush=True)
    rows = []
    for load in (float(x) for x in args.loads.split(",")):
        rate = load * cap
        for rnd in range(args.rounds):
            row: dict[str, Any] = {"load": load, "rate_req_s": rate, "round": rnd, "runs": {}}
            for sched in policies:
                before = os.getloadavg()[0]
                run = run_one(sched, args, rate)
                run["loadavg_before_after"] = [before, os.getloadavg()[0]]
                row["runs"][sched] = run
                print(f"load {load:g} round {rnd} {sched}", json.dumps(run), flush=True)
            runs = row["runs"]
            if "vllm" in runs and "scorpio" in runs:
                row["good_scorpio_over_fcfs"] = runs["scorpio"]["good"] / max(runs["vllm"]["good"], 1)
                print(f"load {load:g} round {rnd}: good requests scorpio {runs['scorpio']['good']} vs fcfs "
                      f"{runs['vllm']['good']} = {row['good_scorpio_over_fcfs']:.2f} x", flush=True)
            rows.append(row)
    doc: dict[str, Any] = {"capacity_req_s": cap, **vars(args), "rows": rows}
    write_result(args.out, doc, "python -m bench.scorpio_live", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
