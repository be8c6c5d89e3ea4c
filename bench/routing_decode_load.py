"""Round 12's decode-load variants of the default (issue 12's TPOT p99 and goodput cells): the
default's cost and guard in numpy, with the decode load priced where the TPOT slack hides it.
Each name is GUARD-TIE-STALL:

    GUARD  q    the default's bound and sticky exemption (hit_i > Q_i, own_i ≤ min kept own)
           qx   … exempt only where r's hit exceeds its whole wait there, hit_i > Q_i + N_i
           qh   … exempt only where more of r is cached than to compute, hit_i ≥ N_i
           qm   … exempt only where r's hit beyond the best kept instance's exceeds Q_i
           qd   … exempt only within 2c × the mean load;  qxd: qx and qd
    TIE    own  ties → ⌊own TTFT⌋, then least recently chosen (rounds 4–11's default)
           rq0  … then fewer running sequences where nothing is queued (the default since round 12)
    STALL  half    the default's: own + (N·B̄ + stalled·B_i)/2, stalled = the tokens beyond i's slack
           excess  + the absorbed tokens stall i's sequences beyond the fleet's mean,
                   (N − stalled)·max(0, B_i − B̄)/2 (the decode load relative to the mean)
           bexcess that excess only among r's best holders: an instance holding less of r
                   pays at least the cheapest best holder's excess (it never outweighs the cache)

    python -m bench.routing_decode_load --tune [--only q-rq0-half,…] [--workloads …] [--loads …]
    python -m bench.routing_decode_load --reported OUT [--only …]   # beside the committed peers
    python -m bench.routing_decode_load --twin 24 [--only q-own-half]   # the live-cadence twin

`--twin N` runs round 11's live-cadence twin (ChatBot, 4 × a100-llama3-8b, 300 requests, rate
3.75 and 11.25 req/s × 4, heartbeat 0.025 s: bench.live_router's twin at ×1 and ×3) on seeds
0 … N−1 with the variants, the router's default and sglang, and prints each one's TTFT p50 /
p99 per seed and how many seeds each wins against sglang.

`q-own-half` is rounds 4–11's default and `q-rq0-half` the router's default since round 12
(tests/test_bench_routing_decode_load.py pins the latter against the router). Numbers:
docs/results-routing.md, round 12.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenyard.services.router import core
from tokenyard.services.router.pipeline import Narrowed, Scored

from bench import routing_ablation as ra

PEERS = ra.PEERS


@dataclass
class Guard:
    sticky: str = "q"
    c: float = 1.25
    name: str = "bound"
    inputs: frozenset[str] = frozenset()

    def narrow(self, req, view, cand) -> Narrowed:
        b = view.load[cand].astype(np.float64)
        keep = b + 1 <= np.ceil(self.c * (b.sum() + 1) / len(cand))
        if keep.all():
            return Narrowed(keep)
        q, n, h = view.queued_prefill[cand], view.new[cand], view.hit[cand]
        own = q + n
        exempt = (h > q) & (own <= own[keep].min())
        if "x" in self.sticky:
            exempt &= h > q + n
        if "h" in self.sticky:
            exempt &= h >= n
        if "m" in self.sticky:
            exempt &= (h - h[keep].max()) > q
        if "d" in self.sticky:
            exempt &= b + 1 <= np.ceil(2 * self.c * (b.sum() + 1) / len(cand))
        return Narrowed(keep | exempt)


@dataclass
class Scorer:
    tie: str = ""
    stall: str = "half"
    name: str = "decode-load"
    inputs: frozenset[str] = frozenset()

    def score(self, req, view, cand) -> Scored:
        q, n = view.queued_prefill[cand], view.new[cand].astype(np.float64)
        b = view.load[cand].astype(np.float64)
        own = q + n
        stalled = np.minimum(np.maximum(own - view.absorb[cand], 0.0), n)
        cost = (stalled * b + n * b.mean()) / 2.0 + own
        excess = (n - stalled) * np.maximum(b - b.mean(), 0.0) / 2.0
        if self.stall == "excess":
            cost = cost + excess
        elif self.stall == "bexcess":
            h = view.hit[cand]
            best = h == h.max()
            cost = cost + np.where(best, excess, np.maximum(excess, excess[best].min()))
        return Scored(cost, tiebreak=ra.tiebreak(self.tie, own, view, cand))


def register(name: str) -> str:
    """The router policy `decode-NAME` for variant NAME (GUARD-TIE-STALL)."""
    guard, tie, stall = name.split("-")
    policy = f"decode-{name}"
    core.POLICIES[policy] = lambda cfg, rng: core.Policy(
        Scorer("" if tie == "own" else tie, stall), guards=[Guard(guard)])
    return policy


VARIANTS = [f"{g}-{t}-{s}" for g in ("q", "qx", "qh", "qm", "qd", "qxd") for t in ("own", "rq0")
            for s in ("half", "excess", "bexcess")]


def twin(names: list[str], seeds: int) -> None:
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    policies = {**{n: register(n) for n in names}, "default": core.DEFAULT_POLICY, "sglang": "sglang"}
    for rate in (3.75, 11.25):
        won = {k: [0, 0] for k in policies}
        for seed in range(seeds):
            w = open_workload("chatbot", num_requests=300, rate=rate, rate_scale=4, seed=seed)
            got = {k: simulate(w, SimConfig(instances=4, profile="a100-llama3-8b", policy=p, heartbeat_s=0.025,
                                            seed=seed), None) for k, p in policies.items()}
            ref = got["sglang"]
            for k, r in got.items():
                won[k][0] += r["median_ttft_ms"] < ref["median_ttft_ms"]
                won[k][1] += r["p99_ttft_ms"] < ref["p99_ttft_ms"]
            print(f"×{rate / 3.75:g} seed {seed}: " + " | ".join(
                f"{k} {r['median_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f}" for k, r in got.items()), flush=True)
        print(f"×{rate / 3.75:g}, seeds won against sglang (p50, p99): " + ", ".join(
            f"{k} {a}, {b}" for k, (a, b) in won.items() if k != "sglang"), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(VARIANTS),
                    help="variants to run, comma list of GUARD-TIE-STALL names such as q-rq0-half: GUARD one of "
                         "q, qx, qh, qm, qd, qxd; TIE own or rq0; STALL half, excess or bexcess (each described at "
                         f"the top of bench/routing_decode_load.py; default: all {len(VARIANTS)})")
    ap.add_argument("--tune", action="store_true", help="the tuning windows, with the peers beside")
    ap.add_argument("--workloads", default="mooncake-tune-a,mooncake-tune-b,mooncake-tune-c,chatbot",
                    help=f"--tune: workloads, comma list of {', '.join(ra.WORKLOADS)} (default: %(default)s)")
    ap.add_argument("--loads", default="0.5,1,1.5,2,3",
                    help="--tune: loads, each a multiplier of the workload's arrival rate, comma list (default: %(default)s)")
    ap.add_argument("--reported", metavar="OUT", help="each variant on the reported cells, into OUT/VARIANT")
    ap.add_argument("--twin", type=int, metavar="N", help="the live-cadence twin on seeds 0 … N−1")
    args = ap.parse_args()
    names = [x for x in args.only.split(",") if x]
    if args.twin:
        twin(names, args.twin)
        return 0
    if args.reported:
        for name in names:
            print(ra.reported(name, register(name), Path(args.reported) / name, str(ra.TRACES), 1000), flush=True)
        return 0
    if not args.tune:
        ap.error("--tune or --reported")
    ra.tune_table(names, register, args.workloads, args.loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
