"""Issue 11's figures over the cluster simulator, with the fleet's defaults (flow control on,
queue policy hybrid, the router's default policy, admission fed heartbeats and queue stats as
live). Deterministic: the same command gives the same numbers on any machine.

    python -m bench.overload priorities [--workload chatbot] [--mix 5,60,30,5] [--n 3000] [--instances 8]
                                        [--load 6] [--skip-requests 0] [--out FILE.json]
    python -m bench.overload overload --workload chatbot|mooncake|azure-code|trace:PATH [--loads 1.5,3]
                                      [--instances 16] [--n 3000] [--skip-requests 0] [--mix 0,1,0,0]
                                      [--out FILE.json]

* priorities — the chatbot workload (or `--workload`) with DESIGN §3.2's class mix 5/60/30/5,
  saturated (8 × a100-llama3-8b at ×6 the workload's base rate): P0's p95 TTFT, deadlines met
  and the output throughput under queue policy `fcfs`, `hybrid` (the default) and `hybrid-wfq`
  (its plain-WFQ fair tier), and the same with flow control off.
  Refused and expired requests count: `p0_p95_ttft_all_ms` is the p95 TTFT over *all* P0
  requests with a refused or expired one counted as never served (∞; so ∞ once more than 5 %
  are lost), beside `p0_served_share` and the p95 over the served ones only.
* overload — goodput at each load two ways: at the issue's fixed SLO (TTFT ≤ 2 s and TPOT ≤
  100 ms) and against each request's own deadline (TTFT ≤ shared.slo.ttft_deadline_s: class
  target + its own predicted prefill, capped, and TPOT ≤ 100 ms); refused (admission; of them the 400s
  whose own prefill does not fit their class's deadline cap, and their share of all prompt
  tokens), expired (queue, past the deadline), met / missed its deadline, and the worst
  completed TTFT over its class target (issue 11: ≤ 2) and over its own deadline.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from bench._out import write_result

GOODPUT = {"ttft": 2000.0, "tpot": 100.0}
P95 = 0.95


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run(workload, **cfg) -> dict[str, Any]:
    """The simulator's result, plus what needs each request: P0's TTFTs with the lost ones, and
    goodput against each request's own deadline."""
    from tokenyard.simulator.cluster import ClusterSim, SimConfig
    from tokenyard.simulator.metrics import result

    items = workload.items()
    sim = ClusterSim(SimConfig(**cfg), workload.block_tokens)
    sim.run(items)
    res = result(sim, items, GOODPUT)
    good = 0
    p0: list[float] = []
    refused_prompt = sum(st.item.prompt_len for st in sim.reqs.values() if st.refused_code == "beyond_class_cap")
    all_prompt = sum(st.item.prompt_len for st in sim.reqs.values())
    for st in sim.reqs.values():
        served = st.finished and st.error is None and len(st.tokens) > 0
        ttft = st.tokens[0] - st.item.arrival_s if served else math.inf
        if st.item.priority == 0:
            p0.append(ttft)
        if not served:
            continue
        tpot = (st.tokens[-1] - st.tokens[0]) / (len(st.tokens) - 1) if len(st.tokens) > 1 else 0.0
        in_time = st.ttft_budget_s <= 0 or ttft <= st.ttft_budget_s
        good += in_time and tpot * 1000.0 <= GOODPUT["tpot"]
    span = res["duration"]
    res["request_goodput_deadline"] = good / span if span > 0 else 0.0
    res["refused_beyond_class_prompt_share"] = refused_prompt / all_prompt if all_prompt else 0.0
    res["p0_ttft_all_s"] = p0
    return res


def p95_all_ms(ttfts: list[float]) -> float:
    """p95 of TTFTs where a lost request is ∞ (nearest rank): ∞ once more than 5 % are lost."""
    if not ttfts:
        return math.nan
    xs = sorted(ttfts)
    v = xs[max(0, math.ceil(P95 * len(xs)) - 1)]
    return v * 1000.0


def row(res: dict[str, Any]) -> dict[str, Any]:
    keep = ("completed", "failed", "request_throughput", "request_goodput", "output_throughput",
            "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "preemptions",
            "request_goodput_deadline", "refused_beyond_class_prompt_share")
    out = {k: res[k] for k in keep}
    out["outcomes"] = res["outcomes"]
    out["p95_ttft_ms_by_class"] = {c: v["p95_ttft_ms"] for c, v in res["by_priority"].items()}
    return out


PRIORITY_POLICIES = ("fcfs", "hybrid", "hybrid-wfq")
"""fcfs, the default hybrid (deadline-first fair tier), and hybrid-wfq (DESIGN §3.3's plain WFQ
fair tier, the default before it): what the priorities study compares."""


def priorities(n: int, instances: int, load: float, workload: str = "chatbot", mix: str = "5,60,30,5",
               skip: int = 0) -> dict[str, Any]:
    from tokenyard.loadgen.config import parse_priority_mix
    from tokenyard.loadgen.workloads import open_workload

    w = open_workload(workload, num_requests=n, rate_scale=load, priority_mix=parse_priority_mix(mix), seed=0,
                      skip_requests=skip)
    runs = {}
    for fc in (True, False):
        for pol in PRIORITY_POLICIES:
            res = run(w, instances=instances, queue_policy=pol, flow_control=fc)
            r = row(res)
            p0 = res["p0_ttft_all_s"]
            r["p0_served_share"] = sum(math.isfinite(t) for t in p0) / len(p0) if p0 else math.nan
            r["p0_p95_ttft_all_ms"] = p95_all_ms(p0)
            runs[f"{pol}{'' if fc else ' (flow control off)'}"] = r
            o = res["outcomes"]["all"]
            print(f"{pol:10} flow_control={fc!s:5} P0 p95 all {r['p0_p95_ttft_all_ms']:8.0f} ms  served "
                  f"{r['p95_ttft_ms_by_class'].get('P0', math.nan):6.0f} ms  P0 served {r['p0_served_share']:.1%}\n"
                  f"{'':10} output {r['output_throughput']:8.0f} tok/s  refused {o['refused']} expired {o['expired']}  "
                  f"met {o['met_slo']} missed {o['missed_slo']}", flush=True)
    h, f = runs["hybrid"], runs["fcfs"]
    ha, fa = h["p0_p95_ttft_all_ms"], f["p0_p95_ttft_all_ms"]
    summary = {
        "p0_p95_all_reduction": 1.0 if math.isinf(fa) and math.isfinite(ha) else 1 - ha / fa,
        "p0_p95_reduction_served": 1 - h["p95_ttft_ms_by_class"]["P0"] / f["p95_ttft_ms_by_class"]["P0"],
        "output_throughput_loss": 1 - h["output_throughput"] / f["output_throughput"],
        "p0_served_share": {"fcfs": f["p0_served_share"], "hybrid": h["p0_served_share"]},
    }
    print(f"P0 p95 TTFT over all P0 (lost = inf): fcfs {fa:.0f} ms, hybrid {ha:.0f} ms; reduction "
          f"{summary['p0_p95_all_reduction']:.1%}; throughput loss {summary['output_throughput_loss']:.2%}")
    return {"runs": runs, "summary": summary}


def overload(workload: str, loads: list[float], instances: int, n: int, mix: str, skip: int = 0) -> dict[str, Any]:
    from tokenyard.loadgen.config import parse_priority_mix
    from tokenyard.loadgen.workloads import open_workload

    rows = {}
    for load in loads:
        w = open_workload(workload, num_requests=n, rate_scale=load, priority_mix=parse_priority_mix(mix), seed=0,
                          skip_requests=skip)
        r = row(run(w, instances=instances))
        rows[f"{load:g}"] = r
        o = r["outcomes"]["all"]
        print(f"x{load:<5g} goodput@2s {r['request_goodput']:7.2f} req/s  @deadline "
              f"{r['request_goodput_deadline']:7.2f}  served {r['completed']}  refused "
              f"{o['refused']} (beyond the class: {o['refused_beyond_class']}, "
              f"{r['refused_beyond_class_prompt_share']:.1%} of prompt tokens)  expired {o['expired']}\n"
              f"{'':6} met {o['met_slo']}  missed {o['missed_slo']}  "
              f"worst TTFT/target {o['max_ttft_over_target']:.2f}  /deadline {o['max_ttft_over_deadline']:.2f}",
              flush=True)
    return {"loads": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=("priorities", "overload"), help="which study to run (see above)")
    p.add_argument("--workload", default="chatbot", help="chatbot | api | coder | trace:PATH")
    p.add_argument("--n", type=int, default=3000, help="requests per run (the first N of a trace)")
    p.add_argument("--instances", type=int, default=None, help="default: 8 (priorities), 16 (overload)")
    p.add_argument("--load", type=float, default=6.0, help="priorities: rate scale")
    p.add_argument("--loads", default="1.5,3", help="overload: rate scales")
    p.add_argument("--mix", default=None, help="class mix P0..P3 (default: 5,60,30,5 priorities, 0,1,0,0 overload)")
    p.add_argument("--skip-requests", type=int, default=0,
                   help="overload, traces: start after this many requests (held-out parts of a trace)")
    p.add_argument("--out", default=None, help="write the result as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.study == "priorities":
        doc = priorities(args.n, args.instances or 8, args.load, args.workload, args.mix or "5,60,30,5",
                         args.skip_requests)
    else:
        doc = overload(args.workload, _floats(args.loads), args.instances or 16, args.n, args.mix or "0,1,0,0",
                       args.skip_requests)
    doc["wall_s"] = time.perf_counter() - t0
    write_result(args.out, doc, "python -m bench.overload", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
