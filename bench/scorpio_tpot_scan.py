"""SCORPIO's TPOT guarantee over many seeds: how many workloads let a decode wait past its SLO.

    python -m bench.scorpio_tpot_scan [--workload bench|long] [--seeds 0-2000] [--rates 8,12,16]
                                      [--threshold 0] [--profile a100-llama3-8b] [--procs 2] [--out FILE.json]

Each (seed, rate) workload is replayed through one SCORPIO engine (services/worker/sim/scorpio.py)
on a virtual clock; its overshoot is the most any decode waited past its TPOT SLO between two
tokens (ms; the property tests/test_sim_scorpio_guard.py draws from the same workloads). A run
fails when it is above 1e-6 ms. Workloads: `bench` = bench.scorpio_goodput's (60 requests, 50 /
200 ms SLOs); `long` = `long_prompts` (40 requests): decodes of five SLOs beside long prompts, so
the tightest request is often one still prefilling. `--threshold` sets the profile's
long_prefill_token_threshold (vLLM's; 0: none).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from multiprocessing import Pool

import numpy as np
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.latency import profile as get_profile
from tokenyard.services.worker.sim.replay import replay
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.shared.schemas import AdmittedRequest

from bench._out import write_result
from bench.scorpio_goodput import workload


def long_prompts(n: int, rate: float, seed: int) -> list[AdmittedRequest]:
    """Decodes of five TPOT SLOs (25, 50, 100, 200, 400 ms) beside long prompts: a fifth of the
    prompts 6,000-20,000 tokens, the rest LN(256, 0.8) in [16, 2048]; outputs LN(150, 0.6) in
    [8, 600]; Poisson arrivals at `rate`."""
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=n - 1))])
    long = rng.random(n) < 0.2
    short = np.clip(np.rint(rng.lognormal(math.log(256), 0.8, size=n)), 16, 2048)
    prompt = np.where(long, rng.integers(6000, 20000, size=n), short).astype(int)
    out = np.clip(np.rint(rng.lognormal(math.log(150), 0.6, size=n)), 8, 600).astype(int)
    stp = rng.choice([25.0, 50.0, 100.0, 200.0, 400.0], size=n)
    return [AdmittedRequest(f"r{i}", "", "m", [], int(prompt[i]), [], 16, int(out[i]), 1, float(arrivals[i]),
                            tpot_slo_ms=float(stp[i])) for i in range(n)]


def tpot_overshoot_ms(prof: LatencyProfile, reqs: list[AdmittedRequest]) -> float:
    """The most any decode waited past its TPOT SLO between two tokens (ms; ≤ 0: none did),
    the requests replayed through one SCORPIO engine."""
    core = SimEngineCore(prof, 16, policy=ScorpioPolicy(prof))
    last: dict[str, float] = {}
    slo = {r.request_id: r.tpot_slo_ms for r in reqs}
    worst = 0.0
    for now, _, res in replay(core, reqs):
        for o in res.outputs:
            if not o.new_token_ids:
                continue
            if o.request_id in last:
                worst = max(worst, (now - last[o.request_id]) * 1000 - slo[o.request_id])
            last[o.request_id] = now
    return worst


def _one(job: tuple[str, str, int, int, float]) -> tuple[int, float, float]:
    kind, prof_name, threshold, seed, rate = job
    prof = dataclasses.replace(get_profile(prof_name), long_prefill_token_threshold=threshold)
    reqs = workload(60, rate, seed=seed) if kind == "bench" else long_prompts(40, rate, seed)
    return seed, rate, tpot_overshoot_ms(prof, reqs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scorpio_tpot_scan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("bench", "long"), default="bench",
                   help="bench: bench.scorpio_goodput's; long: long_prompts (default: %(default)s)")
    p.add_argument("--seeds", default="0-2000", help="first-last, inclusive (default: %(default)s)")
    p.add_argument("--rates", default="8,12,16", help="requests a second, comma list (default: %(default)s)")
    p.add_argument("--threshold", type=int, default=0, help="long_prefill_token_threshold (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b", help="the engine's latency profile (default: %(default)s)")
    p.add_argument("--procs", type=int, default=2, help="worker processes (default: %(default)s)")
    p.add_argument("--out", default=None, help="write the failing runs and the counts as JSON")
    args = p.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    jobs = [(args.workload, args.profile, args.threshold, s, float(r)) for s in seeds for r in args.rates.split(",")]
    with Pool(args.procs) as pool:
        runs = pool.map(_one, jobs, chunksize=8)
    failing = sorted((r for r in runs if r[2] > 1e-6), key=lambda r: -r[2])
    print(f"{len(failing)} of {len(runs)} runs let a decode wait past its TPOT SLO")
    for seed, rate, over in failing[:10]:
        print(f"  seed {seed} at {rate:g} req/s: {over:.3f} ms over")
    write_result(args.out, {"runs": len(runs), "failing": [{"seed": s, "rate": r, "over_ms": o} for s, r, o in failing]},
                 "python -m bench.scorpio_tpot_scan", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
