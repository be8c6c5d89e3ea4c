"""SCORPIO vs FCFS batching on one simulated engine under mixed TPOT SLOs (seed 003).

    python -m bench.scorpio_goodput [--n 2000] [--loads 1,2,3] [--profile a100-llama3-8b] [--out FILE.json]

One engine (services/worker/sim/core.py) on a virtual clock, requests arriving Poisson at
load × `BASE_RATE`: prompts ~ LN(512, 0.8) ∈ [32, 4096] tokens, outputs ~ LN(200, 0.6) ∈
[16, 1024]; half carry a tight TPOT SLO (50 ms), half a loose one (200 ms); every request a
TTFT SLO of 5 s (P1). A request is good when TTFT ≤ 5 s and its own TPOT ≤ its SLO;
goodput = good requests per second of the arrival window (the same window for both
policies, so their ratio is the ratio of good requests; `throughput` is per second of the
whole run, drain included). Policies: `fcfs` = vLLM's (scheduler.py),
`scorpio` = VBS admission + credit batching + the TPOT-bounded token budget + the seed's
rejection path (scorpio.py; ttft_guard.py: a request still waiting, never started, whose first
token can no longer come within its 5 s TTFT deadline at the engine's prefill rate is rejected;
SimEngineCore.expire), `fcfs+reject` = vLLM's with that same rejection (at vLLM's full-step
prefill rate), `scorpio-noreject` = SCORPIO without it. A rejected request counts as not good.
`ceiling` = requests ÷ FCFS's good requests: the largest ratio any policy can reach at that load
(every request good). Steps are run one by one (no folding), outputs land at the end of the step
that made them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import profile as get_profile
from tokenyard.services.worker.sim.replay import replay
from tokenyard.services.worker.sim.scheduler import VllmPolicy
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.shared.schemas import AdmittedRequest

from bench._out import write_result

BASE_RATE = 2.0
TIGHT_MS, LOOSE_MS, TTFT_S = 50.0, 200.0, 5.0


def workload(n: int, rate: float, seed: int = 0) -> list[AdmittedRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=n - 1))])
    prompt = np.clip(np.rint(rng.lognormal(math.log(512), 0.8, size=n)), 32, 4096).astype(int)
    out = np.clip(np.rint(rng.lognormal(math.log(200), 0.6, size=n)), 16, 1024).astype(int)
    tight = rng.random(n) < 0.5
    return [
        AdmittedRequest(f"r{i}", "", "m", [], int(prompt[i]), [], 16, int(out[i]), 1, float(arrivals[i]),
                        tpot_slo_ms=TIGHT_MS if tight[i] else LOOSE_MS)
        for i in range(n)
    ]


def simulate(policy: str, reqs: list[AdmittedRequest], profile: str = "a100-llama3-8b") -> dict[str, Any]:
    """Run `reqs` through one engine under `policy`; goodput and SLO attainment."""
    prof = get_profile(profile)
    if policy.startswith("scorpio"):
        pol = ScorpioPolicy(prof, reject=policy == "scorpio")
    else:
        pol = VllmPolicy()
        pol.rejects_past_deadline = policy == "fcfs+reject"
    core = SimEngineCore(prof, 16, policy=pol)
    rejected = 0
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for now, expired, res in replay(core, reqs):
        rejected += len(expired)
        for o in res.outputs:
            if o.new_token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
    good = 0
    tpot_ok = {TIGHT_MS: [0, 0], LOOSE_MS: [0, 0]}
    ttfts = []
    for r in reqs:
        if r.request_id not in first:  # rejected
            continue
        ttft = first[r.request_id] - r.arrival_s
        tpot = (last[r.request_id] - first[r.request_id]) * 1000 / max(r.max_tokens - 1, 1)
        ok = tpot <= r.tpot_slo_ms
        tpot_ok[r.tpot_slo_ms][0] += ok
        tpot_ok[r.tpot_slo_ms][1] += 1
        good += ok and ttft <= TTFT_S
        ttfts.append(ttft)
    duration = now - reqs[0].arrival_s
    window = reqs[-1].arrival_s - reqs[0].arrival_s
    return {
        "policy": policy, "goodput": good / window, "good": good, "requests": len(reqs), "rejected": rejected,
        "throughput": len(reqs) / duration, "duration_s": duration,
        "tight_tpot_met": tpot_ok[TIGHT_MS][0] / max(tpot_ok[TIGHT_MS][1], 1),
        "loose_tpot_met": tpot_ok[LOOSE_MS][0] / max(tpot_ok[LOOSE_MS][1], 1),
        "p50_ttft_s": float(np.median(ttfts)), "p99_ttft_s": float(np.percentile(ttfts, 99)),
    }


def run(n: int, loads: list[float], profile: str = "a100-llama3-8b") -> list[dict[str, Any]]:
    rows = []
    for load in loads:
        reqs = workload(n, BASE_RATE * load)
        res = {p: simulate(p, reqs, profile) for p in ("fcfs", "fcfs+reject", "scorpio", "scorpio-noreject")}

        def ratio(a: str, b: str, res: dict = res) -> float | None:
            return res[a]["goodput"] / res[b]["goodput"] if res[b]["goodput"] else None

        row = {"load": load, "rate": BASE_RATE * load, **{p: r for p, r in res.items()},
               "goodput_ratio": ratio("scorpio", "fcfs"), "goodput_ratio_same_rejection": ratio("scorpio", "fcfs+reject"),
               "goodput_ratio_noreject": ratio("scorpio-noreject", "fcfs"),
               "ceiling": n / res["fcfs"]["good"] if res["fcfs"]["good"] else None,
               "ceiling_same_rejection": n / res["fcfs+reject"]["good"] if res["fcfs+reject"]["good"] else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scorpio_goodput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="requests per load (default: %(default)s)")
    p.add_argument("--loads", default="1,2,3",
                   help=f"arrival rates as multiples of {BASE_RATE:g} requests a second, comma list (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b", help="the simulated engine's latency profile (default: %(default)s)")
    p.add_argument("--out", default=None, help="write the rows and the command as JSON")
    args = p.parse_args(argv)
    rows = run(args.n, [float(x) for x in args.loads.split(",")], args.profile)
    write_result(args.out, {"rows": rows}, "python -m bench.scorpio_goodput", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
