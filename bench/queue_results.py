"""Issue 7's results over the cluster simulator (the numbers of docs/RESULTS.md's "Admission
and the priority queue" section). Deterministic: the same command gives the same numbers on
any machine (only wall time differs).

    python -m bench.queue_results priorities [--n 3000] [--loads 1,1.5,2,3] [--out FILE.json]
    python -m bench.queue_results bubble     [--n 2000] [--rates 10,12,14] [--out FILE.json]
    python -m bench.queue_results scorpio    [--n 2000] [--loads 1,2,3] [--out FILE.json]

* priorities — seed 001's question: P0's p95 TTFT with priorities (queue policy `hybrid`) and
  without (`fcfs`), on 16 × a100-llama3-8b serving the chatbot workload with DESIGN §3.2's
  class mix 5/60/30/5, at offered loads ×1 … ×3 of the workload's base rate (the simulator
  is open-loop: offered load stands in for the seed's concurrency levels 32…256), and the
  throughput priorities cost (output tokens/s, hybrid vs fcfs). A worker counts as full at
  32 running + waiting requests (the queue's `batch_cap_per_worker`), so the backlog waits
  in the priority queue, where its order is decided; hybrid also has 4 slots per worker
  only P0 may take (`p0_reserve_per_worker`).
* bubble — seed 004's: short-request p50 TTFT and long-request p99 TTFT under SJF, fixed
  log-spaced partitions, bubble queues without and with their placement (`bubble`,
  `bubble-placed`; `bubble-r5`, round 5's bubble, every range its turn each round), and
  FCFS, on the heavy-tailed length mix
  (loadgen/workloads/heavy_tail.py) on 4 × a100-llama3-8b, one class, at several rates around saturation.
* scorpio — seed 003's: goodput of SCORPIO's engine scheduling against FCFS batching under
  mixed TPOT SLOs (services/worker/sim/scorpio.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench._out import write_result


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def sim_run(workload, cfg, queue: dict[str, Any]) -> dict[str, Any]:
    """One simulator run with QueueConfig fields `queue` (batch cap, P0 reserve) set."""
    from dataclasses import replace

    from tokenyard.simulator.cluster import ClusterSim
    from tokenyard.simulator.metrics import result

    sim = ClusterSim(cfg, workload.block_tokens)
    sim.queue.cfg = replace(sim.queue.cfg, **queue)
    items = workload.items()
    sim.run(items)
    return result(sim, items, None)


def priorities(n: int, loads: list[float], instances: int = 16, cap: int = 32) -> list[dict[str, Any]]:
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import SimConfig

    rows = []
    for load in loads:
        w = open_workload("chatbot", num_requests=n, rate_scale=load, priority_mix=(0.05, 0.6, 0.3, 0.05), seed=0)
        res = {}
        for pol in ("fcfs", "hybrid"):
            # the hand-set cap of this older study only acts with flow control off; the defaults'
            # figure is bench/overload.py's `priorities` (docs/results-priorities.md)
            cfg = SimConfig(instances=instances, queue_policy=pol, flow_control=False)
            res[pol] = sim_run(w, cfg, {"batch_cap_per_worker": cap, "p0_reserve_per_worker": 4 if pol != "fcfs" else 0})
        p0 = {pol: r["by_priority"]["P0"]["p95_ttft_ms"] for pol, r in res.items()}
        thr = {pol: r["output_throughput"] for pol, r in res.items()}
        rows.append({
            "load": load, "rate": w.rate, "batch_cap": cap,
            "p0_p95_ttft_ms": p0,
            "p0_p95_reduction": 1 - p0["hybrid"] / p0["fcfs"] if p0["fcfs"] else None,
            "p1_p95_ttft_ms": {pol: r["by_priority"]["P1"]["p95_ttft_ms"] for pol, r in res.items()},
            "p2_p95_ttft_ms": {pol: r["by_priority"]["P2"]["p95_ttft_ms"] for pol, r in res.items()},
            "p3_p95_ttft_ms": {pol: r["by_priority"].get("P3", {}).get("p95_ttft_ms") for pol, r in res.items()},
            "output_throughput": thr,
            "throughput_loss": 1 - thr["hybrid"] / thr["fcfs"],
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bubble(n: int, rates: list[float], instances: int = 4, slots: int = 2) -> list[dict[str, Any]]:
    from tokenyard.loadgen.workloads.heavy_tail import HeavyTailWorkload
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.tuning.evaluate import SimSetup

    from bench.bubble import make_variant

    rows = []
    for rate in rates:
        w = HeavyTailWorkload(n, rate=rate, seed=0)
        row: dict[str, Any] = {"rate": rate}
        for pol in ("sjf", "fixed", "bubble", "bubble-r5", "bubble-placed", "fcfs"):
            m = SimSetup(w, SimConfig(instances=instances, slots_per_worker=slots), pol, make=make_variant).run({})
            row[pol] = {"short_p50_ttft_s": m.short_p50_ttft_s, "long_p99_ttft_s": m.long_p99_ttft_s,
                        "throughput": m.throughput, "completed": m.completed}
        row["long_p99_bubble_over_fixed"] = row["bubble"]["long_p99_ttft_s"] / row["fixed"]["long_p99_ttft_s"]
        row["short_p50_bubble_over_sjf"] = row["bubble"]["short_p50_ttft_s"] / row["sjf"]["short_p50_ttft_s"]
        row["long_p99_placed_over_bubble"] = row["bubble-placed"]["long_p99_ttft_s"] / row["bubble"]["long_p99_ttft_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def scorpio(n: int, loads: list[float]) -> list[dict[str, Any]]:
    from bench.scorpio_goodput import run as run_scorpio

    return run_scorpio(n, loads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.queue_results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=("priorities", "bubble", "scorpio"), help="which study to run (see above)")
    p.add_argument("--n", type=int, default=None, help="requests per run")
    p.add_argument("--loads", default="1,1.5,2,3",
                   help="priorities, scorpio: offered loads as multiples of the workload's base rate, comma list (default: %(default)s)")
    p.add_argument("--rates", default="10,12,14",
                   help="bubble: requests a second of the heavy-tailed mix, comma list (default: %(default)s)")
    p.add_argument("--out", default=None, help="write the rows as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.study == "priorities":
        rows = priorities(args.n or 3000, _floats(args.loads))
    elif args.study == "bubble":
        rows = bubble(args.n or 2000, _floats(args.rates))
    else:
        rows = scorpio(args.n or 2000, _floats(args.loads))
    write_result(args.out, {"study": args.study, "rows": rows, "wall_s": time.perf_counter() - t0},
                 "python -m bench.queue_results", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
