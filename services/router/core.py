"""The router's core: a FleetView fed by heartbeats and macro-instance states, a KV block index
fed by workers' KV events (or by its own predictions), and a policy pipeline
(filters → guards → scorer → picker) that picks the worker for each request.

    route(req, now, exclude) → Choice(worker_id | None, reason, P, BS, hit, …)

One decision:
  1. hit(r, i) for every row from one walk of r's hash chain in the index (view.hit);
  2. the hot-spot detector counts r's prefix and raises its stage-1 warning;
  3. the policy's pipeline decides (round robin instead while the detector's fallback holds);
  4. the chosen row is updated optimistically (FleetView.note_routed), the detector's stage 2
     sees the choice, and for a worker that publishes no KV events the index records r's
     chain as predicted cache contents with a TTL (approximate mode).
If the worker then refuses, the shell asks again with that worker excluded.

Policies are built by name (`POLICIES`), each with its source's defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tokenyard.services.router import kernels
from tokenyard.services.router.bounds import check_inputs
from tokenyard.services.router.filters import (
    AcceptingFilter,
    BatchCapFilter,
    EcoServeGuard,
    HealthyFilter,
    ModelFilter,
    VbsFilter,
)
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.guards import (
    PREFILL_TOKENS_PER_S,
    TTFT_BUDGET_S,
    PrefillBudgetGuard,
)
from tokenyard.services.router.hotspot import HotspotConfig, HotspotDetector, HotspotFilter
from tokenyard.services.router.index import BlockIndex
from tokenyard.services.router.pd import PdLegFilter, pd_decode
from tokenyard.services.router.pipeline import (
    TREE_BLOCKS,
    ArgminPicker,
    Choice,
    Filter,
    Guard,
    Picker,
    Pipeline,
    Scorer,
)
from tokenyard.services.router.policies.dynamo import DynamoScorer, SoftmaxPicker
from tokenyard.services.router.policies.latency import BoundedLoadGuard, MarginalLatencyScorer
from tokenyard.services.router.policies.least_loaded import LeastLoadedScorer
from tokenyard.services.router.policies.llmd import LlmdAffinityGuard, LlmdTokenLoadScorer, LlmdWeightedScorer
from tokenyard.services.router.policies.multiplicative import MultiplicativeScorer
from tokenyard.services.router.policies.round_robin import RoundRobinScorer
from tokenyard.services.router.policies.sglang import SglangCacheAwareScorer
from tokenyard.shared.schemas import AdmittedRequest, Heartbeat, KVEventBatch, MacroState
from tokenyard.shared.slo import OfferPrefill

INDEX_MODES = ("auto", "precise", "approximate")
_NO_BLOCKS = np.empty(0, dtype=np.int64)
_NEVER = np.iinfo(np.int64).max

DEFAULT_POLICY = "marginal-latency"
"""The router's default policy: the one name every service, launcher, simulator and benchmark
imports (docs/results-routing.md shows why it is the default)."""


@dataclass
class RouterConfig:
    policy: str = DEFAULT_POLICY
    stale_after_s: float | None = None
    """None (the default): a worker is out after 10 of the heartbeat intervals it announces
    (shared.staleness, the rule admission and the queue apply); a number: a fixed bound."""
    forget_after_s: float = 60.0
    index_mode: str = "auto"
    """auto: precise for workers that publish KV events, predicted (TTL) for the others;
    precise: events only; approximate: predictions only, events ignored."""
    approx_ttl_s: float = 120.0
    """Dynamo's approximate-mode default (`router_ttl_secs`)."""
    max_index_blocks: int = 8_000_000
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    ttft_budget_s: tuple[float, ...] = TTFT_BUDGET_S
    budget_slack: float = 0.25
    bs_cap: int | None = None
    """Seed 000's batch-size cap (multiplicative policies); None = no cap."""
    log_smooth_above: float | None = None
    """Seed 000's log-smoothing of P above this many tokens (multiplicative policies)."""
    hotspot: HotspotConfig | None = field(default_factory=HotspotConfig)
    """The hot-spot detector of the multiplicative policies; None turns it off."""
    dynamo_temperature: float = 0.0
    seed: int = 0


@dataclass
class Policy:
    scorer: Scorer
    picker: Picker = field(default_factory=ArgminPicker)
    guards: list[Guard] = field(default_factory=list)
    filters: list[Filter] = field(default_factory=list)
    hotspot: bool = False


def _multiplicative(exact: bool, guarded: bool) -> Callable[[RouterConfig, np.random.Generator], Policy]:
    def build(cfg: RouterConfig, rng: np.random.Generator) -> Policy:
        guards: list[Guard] = []
        if guarded:
            guards.append(PrefillBudgetGuard(cfg.prefill_tokens_per_s, cfg.ttft_budget_s, cfg.budget_slack))
        filters: list[Filter] = [BatchCapFilter(cfg.bs_cap)] if cfg.bs_cap is not None else []
        scorer = MultiplicativeScorer(exact=exact, log_smooth_above=cfg.log_smooth_above)
        return Policy(scorer, guards=guards, filters=filters, hotspot=cfg.hotspot is not None)

    return build


POLICIES: dict[str, Callable[[RouterConfig, np.random.Generator], Policy]] = {
    "multiplicative": _multiplicative(exact=False, guarded=True),
    "multiplicative-exact": _multiplicative(exact=True, guarded=False),
    "multiplicative-unguarded": lambda cfg, rng: Policy(MultiplicativeScorer()),
    "marginal-latency": lambda cfg, rng: Policy(MarginalLatencyScorer(), guards=[BoundedLoadGuard()]),
    "dynamo": lambda cfg, rng: Policy(DynamoScorer(), SoftmaxPicker(cfg.dynamo_temperature, rng)),
    "llmd": lambda cfg, rng: Policy(LlmdWeightedScorer()),
    "llmd-token-load": lambda cfg, rng: Policy(LlmdTokenLoadScorer(), guards=[LlmdAffinityGuard()]),
    "sglang": lambda cfg, rng: Policy(SglangCacheAwareScorer()),
    "least-loaded": lambda cfg, rng: Policy(LeastLoadedScorer()),
    "round-robin": lambda cfg, rng: Policy(RoundRobinScorer()),
}
"""multiplicative: P × (BS + 1) with the prefill-budget guard and the hot-spot detector;
multiplicative-exact: the seed's P × BS with its own remedies (detector, BS cap, smoothing);
multiplicative-unguarded: the bare P × (BS + 1), to show what the guards prevent."""


class RouterCore:
    def __init__(self, cfg: RouterConfig):
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy '{cfg.policy}'; known: {', '.join(POLICIES)}")
        if cfg.index_mode not in INDEX_MODES:
            raise ValueError(f"unknown index mode '{cfg.index_mode}'; known: {', '.join(INDEX_MODES)}")
        self.cfg = cfg
        kernels.load()  # numba's compile or cache load here, not at the first decision
        self.view = FleetView()
        self.index = BlockIndex(cfg.max_index_blocks)
        self.rng = np.random.default_rng(cfg.seed)
        spec = POLICIES[cfg.policy](cfg, self.rng)
        self.detector = HotspotDetector(cfg.hotspot) if spec.hotspot and cfg.hotspot is not None else None
        filters: list[Filter] = [
            HealthyFilter(cfg.stale_after_s),
            AcceptingFilter(),
            ModelFilter(),
            VbsFilter(),
            PdLegFilter(),
            *spec.filters,
        ]
        if self.detector is not None:
            filters.append(HotspotFilter(self.detector))
        self.ecoserve = EcoServeGuard(refused={})
        guards = [self.ecoserve, *spec.guards]  # EcoServe first: a no-op on a fleet without it
        self.pipeline = Pipeline(cfg.policy, filters, spec.scorer, spec.picker, guards)
        self.fallback = Pipeline("round-robin", filters, RoundRobinScorer(), ArgminPicker(), guards)
        self._row_slot: np.ndarray | None = None
        self._row_slot_key = (-1, -1)
        self._last_event: dict[str, float] = {}
        self.unanswered: dict[str, dict[str, tuple[int, int]]] = {}
        """Worker → request → (prompt tokens, KV blocks) route added for it, for each offer out
        to that worker with no answer yet (offer_out / offer_answered)."""

    # ── inputs ──
    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        """The worker's row := its heartbeat, plus the offers to it still unanswered
        (`offer_out`): a heartbeat the worker built before it took a request does not count
        it, and without them the row would forget that request until the next heartbeat."""
        i = self.view.upsert(hb, now)
        for new, blocks in self.unanswered.get(hb.worker_id, {}).values():
            self.view.add_routed(i, new, blocks)

    def offer_out(self, worker_id: str, req: AdmittedRequest, choice: Choice) -> None:
        """`choice` (route's, for `req`) is being offered to `worker_id`: until `offer_answered`,
        every heartbeat of that worker's is taken to predate it (see on_heartbeat). The live
        router's (the simulator's offers are answered in the same call: none is ever out)."""
        new = max(req.prompt_len - choice.hit_tokens, 1)  # route's own N and blocks
        self.unanswered.setdefault(worker_id, {})[req.request_id] = (new, -(-new // max(req.block_size, 1)))

    def offer_answered(self, worker_id: str, request_id: str) -> None:
        """The offer's answer came (or none will): the worker's next heartbeat counts the
        request if it took it."""
        out = self.unanswered.get(worker_id)
        if out is not None:
            out.pop(request_id, None)
            if not out:
                del self.unanswered[worker_id]

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now` (FleetView.keepalive); False where it
        would change more than the row's time: the caller sends the heartbeat itself."""
        return self.view.keepalive(worker_id, now)

    def on_kv_events(self, worker_id: str, batch: KVEventBatch, now: float) -> None:
        if self.cfg.index_mode == "approximate":
            return
        self.index.apply(worker_id, batch)
        self._last_event[worker_id] = now

    def on_macro_state(self, state: MacroState) -> None:
        eco = state.mode == "ecoserve"
        for wid in state.workers:
            self.view.set_accepting(wid, wid in state.accepting)
            self.view.set_ecoserve(wid, eco, state.ttft_slo_ms)
            self.view.set_pd_decode(wid, pd_decode(state, wid))

    # ── the decision ──
    def hit_blocks(self, req: AdmittedRequest) -> np.ndarray | None:
        """Cached-prefix length of req's chain, in blocks, on every FleetView row; None when
        no instance holds even its first block."""
        chain = req.block_hashes
        if not chain or self.index.holders.get(chain[0]) is None:
            return None
        per_slot = self.index.match(chain, pad=1)  # the padding entry (0): rows with no slot
        rows = self._rows_to_slots()
        return per_slot[: self.view.n] if rows is None else per_slot[rows]

    def route(self, req: AdmittedRequest, now: float, exclude: frozenset[str] = frozenset()) -> Choice:
        check_inputs(req)
        view, det = self.view, self.detector
        n = view.n
        if n == 0:
            return Choice(None, "no workers known", policy=self.cfg.policy)
        self.index.expire(now)
        blocks = self.hit_blocks(req)
        # hit = min(blocks · B, len), new = max(len − hit, 1), P = Q + new on every row, in one
        # compiled pass (kernels.prefix_rows)
        kernels.prefix_rows(
            _NO_BLOCKS if blocks is None else blocks, n, req.block_size, req.prompt_len,
            len(req.block_hashes) * req.block_size, view.queued_prefill, view.hit, view.new, view.p,
        )
        key, holders, warned = None, 0, False
        if det is not None:
            key = det.key(req)
            det.observe(key, now)
            if key is not None and blocks is not None:
                holders = int(np.count_nonzero(blocks >= det.cfg.prefix_blocks))
                warned = det.warning(key, holders, n)
        pipeline = self.fallback if det is not None and det.fallback(now) else self.pipeline
        if TREE_BLOCKS in pipeline.inputs:
            rows = self._rows_to_slots()
            held = np.append(self.index.blocks_held(), 0)
            view.tree_blocks[:n] = held[:n] if rows is None else held[rows]
        choice = pipeline.choose(req, view, now, exclude)
        choice.hot_warning = warned
        choice.fallback = "round-robin" if pipeline is self.fallback else ""
        if choice.worker_id is None:
            choice.policy = pipeline.name
            return choice
        i = choice.row
        new = int(view.new[i])
        choice.prefill = self._prefill_elsewhere(i, new, exclude)
        choice.hit_tokens = int(view.hit[i])
        choice.p_tokens = float(view.p[i])
        choice.batch_size = int(view.bs[i])
        view.note_routed(i, new, -(-new // max(req.block_size, 1)))
        if det is not None:
            det.record(key, choice.worker_id, warned, holders, now)
        if req.block_hashes and self._predicts(choice.worker_id):
            self.index.predict(choice.worker_id, req.block_hashes, now + self.cfg.approx_ttl_s)
        return choice

    def rows(self) -> dict[str, list]:
        """The latest decision's inputs, row by row (a debug log line's: which instance held
        how much of the request, and how loaded each looked): worker ids, hit tokens, load
        (running + waiting + routed since the heartbeat), queued prefill tokens."""
        v, n = self.view, self.view.n
        return {"workers": list(v.ids[:n]), "hit": v.hit[:n].tolist(), "load": v.load[:n].tolist(),
                "queued": v.queued_prefill[:n].tolist()}

    def housekeeping(self, now: float) -> list[str]:
        """Forget workers silent for `forget_after_s` (rows and index entries) and expire
        predicted blocks; returns the forgotten workers."""
        gone = self.view.forget_silent(now, self.cfg.forget_after_s)
        for wid in gone:
            self.index.forget(wid)
            self._last_event.pop(wid, None)
        for wid in list(self.index.slot_of):
            if wid not in self.view.slot and now - self._last_event.get(wid, now) > self.cfg.forget_after_s:
                self.index.forget(wid)
                del self._last_event[wid]
        self.index.expire(now)
        return gone

    # ── internals ──
    def _prefill_elsewhere(self, i: int, new: int, exclude: frozenset[str]) -> OfferPrefill | None:
        """r's uncached tokens on row i and the fewest on any other row not excluded (those
        that refused it are), from the `new` column the decision just filled; None: no other.
        Every other row counts, eligible or not, so the least is a lower bound."""
        view, n = self.view, self.view.n
        if n < 2:
            return None
        col = view.new[:n]
        if not exclude:  # row i set aside for one reduction (restored at once: one thread)
            col[i] = _NEVER
            least = col.min()
            col[i] = new
        else:
            others = np.ones(n, dtype=np.bool_)
            others[i] = False
            for wid in exclude:
                j = view.slot.get(wid)
                if j is not None:
                    others[j] = False
            least = col[others].min(initial=_NEVER)
        return None if least >= _NEVER else OfferPrefill(new, int(least))

    def _predicts(self, worker_id: str) -> bool:
        mode = self.cfg.index_mode
        return mode == "approximate" or (mode == "auto" and worker_id not in self.index.reported)

    def _rows_to_slots(self) -> np.ndarray | None:
        """Row → index slot, −1 (the padding entry) for a worker the index does not know; None
        where row i is slot i for every row (workers heard from in the same order by both: a
        per-slot array's first n entries are then the rows', no gather needed)."""
        key = (self.view.layout, self.index.version)
        if key != self._row_slot_key:
            get = self.index.slot_of.get
            rows = np.fromiter((get(w, -1) for w in self.view.ids), np.int64, self.view.n)
            self._row_slot = None if bool((rows == np.arange(self.view.n)).all()) else rows
            self._row_slot_key = key
        return self._row_slot


ROUTE_ATTEMPTS = 3
"""Offers per request: a worker that refuses is excluded and the core asked again."""


class Placement:
    """One request's placement attempts, shared by the router shell (offers over NATS) and
    the simulator (offers in process), so both retry alike:

        p = Placement(core, req)
        while (choice := p.next(now)) is not None:
            if offer(choice.worker_id) accepted: done
            p.refused(choice.worker_id, reason)
        → no capacity, p.reason says why

    `only`: the workers the request may go to (the queue's placement, QueueCore.placed_on);
    None: any.
    """

    def __init__(self, core: RouterCore, req: AdmittedRequest, attempts: int = ROUTE_ATTEMPTS,
                 only: frozenset[str] | None = None):
        self.core = core
        self.req = req
        self.left = attempts
        self.excluded: set[str] = set()
        self.only = only
        self.reason = ""

    def next(self, now: float) -> Choice | None:
        """The next worker to offer the request to, or None when out of attempts or candidates."""
        if self.left <= 0:
            return None
        self.left -= 1
        excluded = self.excluded
        if self.only is not None:
            view = self.core.view
            excluded = excluded | {w for w in view.ids[: view.n] if w not in self.only}
        choice = self.core.route(self.req, now, frozenset(excluded))
        if choice.worker_id is None:
            self.reason = choice.reason
            return None
        return choice

    def refused(self, worker_id: str, why: str) -> None:
        self.excluded.add(worker_id)
        self.reason = f"{worker_id} refused: {why}"
