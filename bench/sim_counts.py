"""What the cluster simulator does per run, with silent ticks off and on: the work behind its speed.

    python -m bench.sim_counts [--requests N] [--instances N] [--json FILE]

Replays the first N Mooncake requests (default 2,000) on N a100-llama3-8b instances (default
128) twice, SimConfig.quiet_ticks False then True, and counts heartbeats into the cores (each
reaches the router, queue and admission alike: the router's are counted), keep-alives asked
of the router (the first core asked), engine stats computed (`engine_stats`), engine fold
calls and STEP_DONE events. Both runs must give the same result (completed, mean TTFT).
"""

from __future__ import annotations

import argparse
import sys

import tokenyard.services.worker.sim.core as engine_core
from tokenyard.loadgen.workloads import open_workload
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig
from tokenyard.simulator.metrics import result

from bench._out import write_result


def counted(workload, instances: int, quiet: bool) -> dict:
    sim = ClusterSim(SimConfig(instances=instances, quiet_ticks=quiet), workload.block_tokens, ChainCache())
    n = {"heartbeats": 0, "keepalives": 0, "engine_stats": 0, "folds": 0}

    def counting(f, key):
        def call(*args, **kwargs):
            n[key] += 1
            return f(*args, **kwargs)
        return call

    sim.receivers[0] = counting(sim.receivers[0], "heartbeats")
    sim.keepers[0] = counting(sim.keepers[0], "keepalives")
    fold, stats = engine_core.SimEngineCore.fold, engine_core.engine_stats
    engine_core.SimEngineCore.fold = counting(fold, "folds")
    engine_core.engine_stats = counting(stats, "engine_stats")
    try:
        items = workload.items()
        sim.run(items)
    finally:
        engine_core.SimEngineCore.fold, engine_core.engine_stats = fold, stats
    res = result(sim, items, None)
    return {"quiet_ticks": quiet, **n, "step_done": sim.step_events, "completed": res["completed"],
            "mean_ttft_ms": res["mean_ttft_ms"], "wall_s": sim.wall_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_counts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="first N Mooncake requests (default 2000)")
    ap.add_argument("--instances", type=int, default=128, help="fleet size (default 128)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the rows here")
    args = ap.parse_args(argv)
    w = open_workload("mooncake", num_requests=args.requests)
    rows = [counted(w, args.instances, q) for q in (False, True)]
    write_result(args.json, rows)
    keys = ("heartbeats", "keepalives", "engine_stats", "folds", "step_done", "completed", "mean_ttft_ms")
    print(f"{'quiet_ticks':>11} " + " ".join(f"{k:>12}" for k in keys))
    for r in rows:
        print(f"{r['quiet_ticks']!s:>11} " + " ".join(f"{r[k]:>12.6g}" if isinstance(r[k], float) else f"{r[k]:>12}"
                                                   for k in keys))
    same = (rows[0]["completed"], rows[0]["mean_ttft_ms"]) == (rows[1]["completed"], rows[1]["mean_ttft_ms"])
    if not same:
        print("the two runs' results differ", file=sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
