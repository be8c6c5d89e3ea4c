"""Issue 11's figures over the cluster simulator, with the fleet's defaults (flow control on,
queue policy hybrid, the router's default policy, admission fed heartbeats and queue stats as
live). Deterministic: the same command gives the same numbers on any machine.

    python -m bench.overload priorities [--n 3000] [--instances 8] [--load 6] [--out FILE.json]
    python -m bench.overload overload --workload chatbot|trace:PATH [--loads 1.5,3] [--instances 16]
                                      [--n 3000] [--mix 0,1,0,0] [--out FILE.json]

* priorities — the chatbot workload with DESIGN §3.2's class mix 5/60/30/5, saturated (8 ×
  a100-llama3-8b at ×6 the workload's base rate): P0's p95 TTFT and the output throughput under
  queue policy `fcfs` and `hybrid`, and the same with flow control off (the old default).
  Refused and expired requests are reported beside the TTFTs (a refused request has none):
  `p0_lost_share` is the share of P0 requests refused or expired; above 5 %, P0's p95 TTFT
  counting a lost request as never served is ∞.
* overload — goodput (TTFT ≤ 2 s and TPOT ≤ 100 ms) at each load, with refused (admission),
  expired (queue, past the deadline), met-SLO and missed-SLO counts, and the worst completed
  TTFT over its class target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

GOODPUT = {"ttft": 2000.0, "tpot": 100.0}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run(workload, **cfg) -> dict[str, Any]:
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    return simulate(workload, SimConfig(**cfg), GOODPUT)


def row(res: dict[str, Any]) -> dict[str, Any]:
    keep = ("completed", "failed", "request_throughput", "request_goodput", "output_throughput",
            "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "preemptions")
    out = {k: res[k] for k in keep}
    out["outcomes"] = res["outcomes"]
    out["p95_ttft_ms_by_class"] = {c: v["p95_ttft_ms"] for c, v in res["by_priority"].items()}
    return out


def priorities(n: int, instances: int, load: float) -> dict[str, Any]:
    from tokenyard.loadgen.workloads import open_workload

    w = open_workload("chatbot", num_requests=n, rate_scale=load, priority_mix=(0.05, 0.6, 0.3, 0.05), seed=0)
    runs = {}
    for fc in (True, False):
        for pol in ("fcfs", "hybrid"):
            res = run(w, instances=instances, queue_policy=pol, flow_control=fc)
            r = row(res)
            o = res["outcomes"]["P0"]
            lost = o["refused"] + o["expired"]
            r["p0_lost_share"] = lost / (lost + o["met_slo"] + o["missed_slo"] + o["failed_other"])
            runs[f"{pol}{'' if fc else ' (flow control off)'}"] = r
            print(f"{pol:7} flow_control={fc!s:5} P0 p95 {r['p95_ttft_ms_by_class']['P0']:8.0f} ms  "
                  f"P0 lost {r['p0_lost_share']:.1%}  output {r['output_throughput']:8.0f} tok/s  "
                  f"refused {res['outcomes']['all']['refused']} expired {res['outcomes']['all']['expired']}",
                  flush=True)
    h, f = runs["hybrid"], runs["fcfs"]
    summary = {
        "p0_p95_reduction_served": 1 - h["p95_ttft_ms_by_class"]["P0"] / f["p95_ttft_ms_by_class"]["P0"],
        "output_throughput_loss": 1 - h["output_throughput"] / f["output_throughput"],
        "p0_lost_share": {"fcfs": f["p0_lost_share"], "hybrid": h["p0_lost_share"]},
    }
    return {"runs": runs, "summary": summary}


def overload(workload: str, loads: list[float], instances: int, n: int, mix: str) -> dict[str, Any]:
    from tokenyard.loadgen.config import parse_priority_mix
    from tokenyard.loadgen.workloads import open_workload

    rows = {}
    for load in loads:
        w = open_workload(workload, num_requests=n, rate_scale=load, priority_mix=parse_priority_mix(mix), seed=0)
        r = row(run(w, instances=instances))
        rows[f"{load:g}"] = r
        o = r["outcomes"]["all"]
        print(f"x{load:<5g} goodput {r['request_goodput']:7.2f} req/s  served {r['completed']}  refused "
              f"{o['refused']}  expired {o['expired']}  met {o['met_slo']}  missed {o['missed_slo']}  "
              f"worst TTFT/target {o['max_ttft_over_target']:.2f}", flush=True)
    return {"loads": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=("priorities", "overload"))
    p.add_argument("--workload", default="chatbot", help="chatbot | api | coder | trace:PATH")
    p.add_argument("--n", type=int, default=3000, help="requests per run (the first N of a trace)")
    p.add_argument("--instances", type=int, default=None, help="default: 8 (priorities), 16 (overload)")
    p.add_argument("--load", type=float, default=6.0, help="priorities: rate scale")
    p.add_argument("--loads", default="1.5,3", help="overload: rate scales")
    p.add_argument("--mix", default="0,1,0,0", help="overload: class mix P0..P3")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.study == "priorities":
        doc = priorities(args.n, args.instances or 8, args.load)
    else:
        doc = overload(args.workload, _floats(args.loads), args.instances or 16, args.n, args.mix)
    doc["command"] = "python -m bench.overload " + " ".join(sys.argv[1:] if argv is None else argv)
    doc["wall_s"] = time.perf_counter() - t0
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
