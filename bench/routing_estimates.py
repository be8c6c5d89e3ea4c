"""Round 13's variants of the default (issue 12's mean-TTFT cells): what the router believes an
instance holds and queues between two of its reports. The default's own kernels decide; each
variant changes one input around them (RouterCore.route wrapped for the variants' policies):

    base    the default as it is (marginal-latency: the bounded-load guard, c = 1.25)
    c1.5, c2, c3  the guard's bound at c = 1.5, 2 and 3 (× the candidates' mean load)
    fly     cache credit for blocks in flight: r's chain is recorded on the chosen instance as
            predicted blocks (BlockIndex.predict) until r's predicted first token there,
            2 × (Q_i + N_i) × t_i after the decision (at least 0.1 s; 1 s where t_i is not
            measured yet); its own KV events replace them (stored: kept; never stored: they
            expire, a little late: BlockIndex expires in insertion order, made for one TTL). A request for the same prefix routed before r's
            prefill ends then sees the hit it will find once r's blocks are computed.
    decay   the heartbeat's queued prefill drained since it was sent: Q_i := max(0, Q_hb −
            (now − heard) / t_i) + what was routed to i since (t_i: i's prefill ms per token)
    gdecay  the drained queue in the guard (bound and sticky exemption) only, not in the cost
    soonest the sticky exemption without its cache clause: beyond the bound, i keeps r wherever
            Q_i + N_i ≤ min over the kept of Q_k + N_k
    fly+decay  both;  stepk+c2: stepk (below) behind the bound at c = 2;  decay+step1, decay+stepk
    step1   r's own TTFT counts i's decodes in the step that gives r its first token: own_i +=
            B_i + ρ_i · C_i (B_i sequences on i, one token each in the step; C_i the context
            they hold, kv_used × block; ρ_i = the heartbeat's decode attention per context
            token ÷ its prefill cost per token), in the cost and its tie-break
    stepk   the same in each of the k_i = ⌈(Q_i + N_i) / 2048⌉ steps r's prefill (and the queue
            ahead of it) takes: own_i += k_i · (B_i + ρ_i · C_i)

    python -m bench.routing_estimates --tune [--only base,fly,…] [--workloads …] [--loads …]
    python -m bench.routing_estimates --reported OUT [--only fly]   # beside the committed peers
    python -m bench.routing_estimates --count TABLE …   # --tune's tables: cells won, geomean ÷ base

Numbers: docs/results-routing.md, round 13.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenyard.services.router import core
from tokenyard.services.router.pipeline import Narrowed, Scored
from tokenyard.services.router.policies.latency import BoundedLoadGuard, MarginalLatencyScorer

from bench import routing_ablation as ra

PEERS = ra.PEERS
VARIANTS = ("base", "c1.5", "c2", "c3", "fly", "decay", "fly+decay", "step1", "stepk", "stepk+c2", "decay+step1",
            "decay+stepk", "gdecay", "soonest")
_route = core.RouterCore.route


def _decayed(view, now: float) -> np.ndarray:
    """Per row, the prefill tokens row i's engine has run since its heartbeat (at most what
    the heartbeat queued): elapsed / t_i."""
    n = view.n
    q_hb = np.fromiter((s.queued_prefill_tokens for s in view.stats[:n]), np.float64, n)
    t = view.ms_per_token[:n]
    ran = np.where(t > 0.0, np.maximum(now - view.seen_s[:n], 0.0) * 1000.0 / np.where(t > 0.0, t, 1.0), 0.0)
    return np.floor(np.minimum(ran, q_hb))


def route(self, req, now, exclude=frozenset()):
    """RouterCore.route with the variant's inputs (the policy's name says which)."""
    name = self.cfg.policy
    if not name.startswith("estimate-"):
        return _route(self, req, now, exclude)
    view = self.view
    d = _decayed(view, now) if "decay" in name and "gdecay" not in name else None
    view.decay = _decayed(view, now) if "gdecay" in name else None
    if d is not None:
        view.queued_prefill[: view.n] -= d
    try:
        choice = _route(self, req, now, exclude)
    finally:
        if d is not None:
            view.queued_prefill[: view.n] += d
    if "fly" in name and choice.worker_id is not None and req.block_hashes:
        t = view.ms_per_token[choice.row]
        wait_s = 2.0 * choice.p_tokens * t / 1000.0 if t > 0.0 else 1.0
        self.index.predict(choice.worker_id, req.block_hashes, now + max(wait_s, 0.1))
    return choice


@dataclass
class StepScorer:
    """The default's cost (kernels.marginal_cost in numpy) with i's decodes in r's own TTFT."""

    k: str = "1"
    name: str = "step"
    inputs: frozenset[str] = frozenset()

    def score(self, req, view, cand) -> Scored:
        q, n = view.queued_prefill[cand], view.new[cand].astype(np.float64)
        b = view.load[cand].astype(np.float64)
        own = q + n
        stalled = np.minimum(np.maximum(own - view.absorb[cand], 0.0), n)
        t = view.ms_per_token[cand]
        d2 = np.fromiter((view.stats[i].decode_ms_per_ctx_token for i in cand), np.float64, len(cand))
        rho = np.where(t > 0.0, d2 / np.where(t > 0.0, t, 1.0), 0.0)
        ctx = (view.kv_used[cand] * view.block_size[cand]).astype(np.float64)
        steps = np.ceil(own / CHUNK) if self.k == "k" else 1.0
        mine = own + steps * (b + rho * ctx)
        cost = (stalled * b + n * b.mean()) / 2.0 + mine
        r = view.running[cand].astype(np.float64)
        tie = np.floor(mine) + np.where(q == 0, r / (r.max() + 1.0), 0.0)
        return Scored(cost, tiebreak=tie)


@dataclass
class DecayedGuard(BoundedLoadGuard):
    """The default's guard on the drained queue (`gdecay`: the scorer keeps the heartbeat's)."""

    def narrow(self, req, view, cand):
        d = getattr(view, "decay", None)
        if d is None:
            return super().narrow(req, view, cand)
        view.queued_prefill[: view.n] -= d
        try:
            return super().narrow(req, view, cand)
        finally:
            view.queued_prefill[: view.n] += d


@dataclass
class SoonestGuard(BoundedLoadGuard):
    """`soonest`: the bound's sticky exemption without its cache clause (hit_i > Q_i): an
    instance beyond the bound keeps r wherever r's own first token comes no later there."""

    def narrow(self, req, view, cand):
        b = view.load[cand].astype(np.float64)
        keep = b + 1 <= np.ceil(self.c * (b.sum() + 1) / len(cand))
        if keep.all():
            return Narrowed(keep)
        own = view.queued_prefill[cand] + view.new[cand]
        return Narrowed(keep | (own <= own[keep].min()))


CHUNK = 2048
"""vLLM's chunked-prefill token budget (max_num_batched_tokens) on these profiles."""


def register(name: str) -> str:
    """The router policy `estimate-NAME` for variant NAME."""
    core.RouterCore.route = route
    c = 1.5 if "c1.5" in name else 2.0 if "c2" in name else 3.0 if "c3" in name else 1.25
    policy = f"estimate-{name}"
    step = name.find("step")
    scorer = StepScorer(name[step + 4]) if step >= 0 else MarginalLatencyScorer()
    guard = DecayedGuard if "gdecay" in name else SoonestGuard if "soonest" in name else BoundedLoadGuard
    core.POLICIES[policy] = lambda cfg, rng: core.Policy(scorer, guards=[guard(c=c)])
    return policy


def count(paths: list[str]) -> str:
    """Cells won on --tune's tables (the sweep's tests against the best of the five peers in
    each cell) and each variant's geomean ÷ `base` over the cells both ran."""
    rows: dict[tuple[str, str], dict[str, tuple[float, ...]]] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 8 or not cols[3].replace(".", "", 1).isdigit():
                continue
            rows.setdefault((cols[0], cols[1]), {})[cols[2]] = tuple(float(x) for x in cols[3:7])
    names = sorted({v for cell in rows.values() for v in cell if v not in PEERS})
    out = ["| variant | TTFT | TPOT p99 | hit | goodput | cells | geomean ÷ base: TTFT, TPOT p99, hit, goodput |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for name in names:
        won, logs, n, nb = [0, 0, 0, 0], [0.0] * 4, 0, 0
        for cell in rows.values():
            if name in cell and "base" in cell:
                nb += 1
                logs = [a + math.log(x / y) for a, x, y in zip(logs, cell[name], cell["base"], strict=True)]
            if name not in cell or not set(PEERS) <= set(cell):
                continue
            n += 1
            m, peers = cell[name], [cell[p] for p in PEERS]
            won[0] += m[0] <= 0.9 * min(x[0] for x in peers)
            won[1] += m[1] <= min(x[1] for x in peers)
            won[2] += m[2] >= max(x[2] for x in peers) - 0.01
            won[3] += m[3] >= max(x[3] for x in peers)
        geo = ", ".join(f"{(math.exp(x / nb) - 1) * 100:+.2f}%" for x in logs) if nb and name != "base" else ""
        out.append(f"| {name} | {' | '.join(map(str, won))} | {n} | {geo} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(VARIANTS),
                    help=f"variants to run, comma list of {', '.join(VARIANTS)} (each described at the top of "
                         "bench/routing_estimates.py; default: all of them)")
    ap.add_argument("--tune", action="store_true", help="the tuning windows, with the peers beside")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="--tune: router policies run beside the variants, comma list (default: %(default)s; empty: none)")
    ap.add_argument("--workloads", default="mooncake-tune-a,mooncake-tune-b,mooncake-tune-c,chatbot",
                    help=f"--tune: workloads, comma list of {', '.join(ra.WORKLOADS)} (default: %(default)s)")
    ap.add_argument("--loads", default="0.5,1,1.5,2,3",
                    help="--tune: loads, each a multiplier of the workload's arrival rate, comma list (default: %(default)s)")
    ap.add_argument("--reported", metavar="OUT", help="each variant on the reported cells, into OUT/VARIANT")
    ap.add_argument("--count", nargs="+", metavar="TABLE", help="cells won on --tune's printed tables")
    args = ap.parse_args()
    if args.count:
        print(count(args.count))
        return 0
    names = [x for x in args.only.split(",") if x]
    if args.reported:
        for name in names:
            print(ra.reported(name, register(name), Path(args.reported) / name, str(ra.TRACES), 1000), flush=True)
        return 0
    if not args.tune:
        ap.error("--tune or --reported")
    ra.tune_table(names, register, args.workloads, args.loads, [p for p in args.peers.split(",") if p])
    return 0


if __name__ == "__main__":
    sys.exit(main())
