"""Does a routing policy sort requests by size? Mean and p90 TTFT per quartile of prompt
length, per policy, on one simulated workload (16 × a100-llama3-8b, the cluster simulator).
A policy that sorts by size serves the short quartiles fast and the long one late: the
ratio long / short grows against the other policies'.

    python -m bench.routing_by_size --workload trace:TRACES/mooncake_conversation_trace.jsonl \
        --skip-requests 6016 --num-requests 3000 --rate-scale 3 \
        --policies marginal-latency,llmd-token-load,multiplicative
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenyard.loadgen.workloads import open_workload
from tokenyard.simulator.cluster import ClusterSim, SimConfig


def by_quartile(sim: ClusterSim) -> list[tuple[int, float, float, int]]:
    """(largest prompt in the quartile, mean TTFT s, p90 TTFT s, requests) per quartile of
    prompt length, over the finished requests."""
    done = [(st.item.prompt_len, st.tokens[0] - st.item.arrival_s) for st in sim.reqs.values()
            if st.finished and len(st.tokens)]
    lens = np.array([d[0] for d in done])
    ttft = np.array([d[1] for d in done])
    edges = np.quantile(lens, [0.25, 0.5, 0.75, 1.0])
    out, lo = [], -1
    for hi in edges:
        sel = (lens > lo) & (lens <= hi)
        out.append((int(hi), float(ttft[sel].mean()), float(np.quantile(ttft[sel], 0.9)), int(sel.sum())))
        lo = hi
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True,
                    help="the workload: chatbot | api | coder | trace:PATH (tokenyard sim's specs)")
    ap.add_argument("--num-requests", type=int, default=None,
                    help="requests to run; of a trace, the first ones after --skip-requests (default: a trace's all, "
                         "a generated workload's 1000)")
    ap.add_argument("--skip-requests", type=int, default=0, help="trace requests skipped at its start (default: %(default)s)")
    ap.add_argument("--rate-scale", type=float, default=1.0,
                    help="multiplier of the workload's arrival rate (default: %(default)s; 2: twice as fast)")
    ap.add_argument("--policies", default="marginal-latency,llmd-token-load,multiplicative",
                    help="routing policies to compare, comma list (default: %(default)s)")
    args = ap.parse_args()
    w = open_workload(args.workload, num_requests=args.num_requests, rate_scale=args.rate_scale,
                      skip_requests=args.skip_requests)
    print("| policy | quartile (prompt ≤ tokens) | requests | TTFT mean (s) | TTFT p90 (s) |")
    print("|---|---:|---:|---:|---:|")
    for policy in args.policies.split(","):
        sim = ClusterSim(SimConfig(instances=16, profile="a100-llama3-8b", policy=policy), w.block_tokens)
        sim.run(w.items())
        rows = by_quartile(sim)
        for hi, mean, p90, n in rows:
            print(f"| {policy} | ≤ {hi:,} | {n} | {mean:.1f} | {p90:.1f} |", flush=True)
        print(f"| {policy} | long / short mean | | {rows[-1][1] / rows[0][1]:.1f}× | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
