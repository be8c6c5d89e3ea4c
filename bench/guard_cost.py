"""What the bounded-load guard's sticky exemption costs a decision: the guard's `narrow` with
and without it, timed side by side in one process on the same fleet (alternating, so other
processes' load falls on both alike), at N instances with seeded load and prefix hits.

    python -m bench.guard_cost [--instances 256] [--decisions 2000] [--repeats 7]

Prints p50 / p99 of each decision's least time over the repeats (µs), for the guard alone and
for guard + scorer (MarginalLatencyScorer on the guard's candidates)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.policies.latency import BoundedLoadGuard, MarginalLatencyScorer
from tokenyard.shared.schemas import AdmittedRequest, EngineStats, Heartbeat


def fleet(n: int, rng: np.random.Generator) -> FleetView:
    v = FleetView(n)
    running, queued, used = rng.integers(0, 65, n), rng.integers(0, 16_001, n), rng.integers(0, 20_000, n)
    for i in range(n):
        stats = EngineStats(int(running[i]), int(running[i] // 8), int(queued[i]), int(used[i]), 27_343 - int(used[i]), 16)
        v.upsert(Heartbeat(f"w{i:03d}", "m", 0, 0.0, stats), 0.0)
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=256, help="simulated workers in the fleet (default: %(default)s)")
    ap.add_argument("--decisions", type=int, default=2000, help="routing decisions timed, one request each (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=7,
                    help="times each decision is timed; the least time counts (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the fleet's load, the prompt lengths and the prefix hits (default: %(default)s)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    v = fleet(args.instances, rng)
    cand = np.arange(v.n)
    reqs, hits = [], []
    for k in range(args.decisions):
        plen = int(rng.integers(256, 16_000))
        reqs.append(AdmittedRequest(f"r{k}", "", "m", [], plen, [], 16, 256, 1, 0.0))
        h = np.zeros(v.n, dtype=np.int64)
        holders = rng.integers(0, v.n, 3)
        h[holders] = rng.integers(0, plen, 3)
        hits.append(h)
    guards = {"bound": BoundedLoadGuard(sticky=False), "bound+sticky": BoundedLoadGuard()}
    scorer = MarginalLatencyScorer()
    best = {(g, part): np.full(args.decisions, np.inf) for g in guards for part in ("guard", "guard+scorer")}
    exempt = 0
    clock = time.perf_counter_ns
    for rep in range(args.repeats):
        for k, (r, h) in enumerate(zip(reqs, hits, strict=True)):
            v.hit[: v.n] = h
            v.new[: v.n] = np.maximum(r.prompt_len - h, 1)
            for g in (guards if (k + rep) % 2 else reversed(list(guards))):
                t0 = clock()
                keep, note = guards[g].narrow(r, v, cand)
                t1 = clock()
                c = cand[keep] if keep is not True else cand
                scorer.score(r, v, c)
                t2 = clock()
                best[g, "guard"][k] = min(best[g, "guard"][k], (t1 - t0) / 1e3)
                best[g, "guard+scorer"][k] = min(best[g, "guard+scorer"][k], (t2 - t0) / 1e3)
                exempt += rep == 0 and note == "sticky"
    print(f"{args.instances} instances, {args.decisions} decisions × {args.repeats} (least time each); "
          f"sticky exemption applied in {exempt} decisions")
    print("| guard | part | p50 (µs) | p99 (µs) |")
    print("|---|---|---:|---:|")
    for (g, part), t in best.items():
        print(f"| {g} | {part} | {np.percentile(t, 50):.1f} | {np.percentile(t, 99):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
