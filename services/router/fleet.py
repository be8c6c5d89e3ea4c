"""The router's view of the fleet: one row per worker, each field a numpy array, so a
scorer computes over all instances at once (no per-instance Python loop on the hot path).

Rows are set from heartbeats and corrected optimistically at each decision:
    routed to i  ⇒  waiting[i] += 1, load[i] += 1, bs[i] += 1, queued_prefill[i] += new tokens,
                    kv_used[i] += new blocks
so requests between two heartbeats do not herd onto one instance; the next heartbeat
overwrites the guess with the truth. `bs` is the batch size the KV-aware scorers use:
BS(i) = running(i) + requests routed to i since its last heartbeat. `hit`, `new` and `p`
are per-decision scratch, set by the core before the filters and scorers run: the current
request's cached prefix on each row in tokens (looked up once in the KV block index), its
uncached tokens there, new = max(len − hit, 1) (an engine always computes at least one), and
P = queued_prefill + new. `tree_blocks` (blocks the index holds per row) is built only for a
pipeline that declares it (services/router/pipeline.py, `inputs`).
Rows of workers silent for `forget_after_s` are dropped (bounded memory); a row is a
candidate only while fresh (heard from within its `stale_s`, shared.staleness). `keepalive` repeats a row's latest heartbeat
(only its time moves) where no decision has corrected the row since: `hb_decision` is the
decision count at the row's heartbeat, `last_chosen` that of the latest decision for it.
"""

from __future__ import annotations

import math

import numpy as np
from tokenyard.shared import staleness
from tokenyard.shared.schemas import EngineStats, Heartbeat, Phase

PHASES = {Phase.MIXED: 0, Phase.PREFILL: 1, Phase.DECODE: 2}


def absorb_tokens(s: EngineStats) -> float:
    """Prefill tokens an engine's running decodes can take beside them within their TPOT SLO:
    their tightest saved slack over its prefill cost per token. ∞ where nothing decodes (an
    engine that reports its prefill cost reports its decodes' slack); 0 where it reports no
    prefill cost (not measured yet: every token counts as a stall)."""
    if not s.prefill_ms_per_token > 0.0:  # 0, or a NaN from a broken estimate
        return 0.0
    if s.tpot_slack_ms is None:
        return math.inf
    absorb = s.tpot_slack_ms / s.prefill_ms_per_token
    return absorb if absorb == absorb else 0.0  # a NaN slack absorbs nothing (the score stays finite)


class FleetView:
    _FLOAT = (
        "queued_prefill",
        "seen_s",
        "stale_s",
        "step_ms",
        "p",
        "slack_ms",
        "ms_per_token",
        "eco_ttft_ms",
        "vbs",
        "min_stp_ms",
        "vbs_limit",
        "absorb",
    )
    _INT = (
        "running",
        "waiting",
        "kv_used",
        "kv_free",
        "last_chosen",
        "model",
        "bs",
        "hit",
        "new",
        "block_size",
        "tree_blocks",
        "hb_decision",
        "load",
    )
    _BOOL = ("healthy", "accepting", "eco", "pd_decode")
    """`eco`, `eco_ttft_ms`, `slack_ms`, `ms_per_token`: EcoServe's constraint check (issue 8):
    the row's macro-instance runs EcoServe with this TTFT SLO; its decodes' saved TPOT slack
    (NaN: none decodes) and its prefill cost per token, from heartbeats. `absorb`: that slack
    in prefill tokens, slack_ms / ms_per_token (∞: none decodes; 0: no prefill cost reported),
    the decode term of the default's stall (services/router/policies/latency.py). `stale_s`:
    the silence after which the row is out (shared.staleness, from the interval its worker
    announces). `load`: running + waiting, the sequences on the row (the default's bound and
    stall), kept by the writers below instead of added up per decision."""
    COLUMNS = (*_FLOAT, *_INT, *_BOOL, "phase")
    """Every per-worker column (an array of the view's rows, by that name)."""

    def __init__(self, capacity: int = 16):
        self.n = 0
        self.ids: list[str] = []
        self.slot: dict[str, int] = {}
        self.macro: list[str] = []
        self.stats: list[EngineStats] = []
        """Each row's latest engine stats, whole: the columns below are the scorers' vectorised
        copies of some of them; the rest (prefix hits, preemptions, host KV tier, compute
        use, the prefill cost's L² term) are here for whoever reads a row."""
        self.model_codes: dict[str, int] = {}
        """model name → the code stored in the `model` column."""
        self._alloc(capacity)
        self._every_row = np.arange(0)
        self.decisions = 0
        self.layout = 0
        """Bumped whenever rows are added or moved (callers cache row maps on it)."""
        self._has_eco: bool | None = False
        self._all_healthy: bool | None = True
        self._all_accepting: bool | None = True
        self._min_seen: float | None = None
        self._one_stale_s: float | None = None
        """The `stale_s` every row shares (NaN: they differ)."""
        """Facts about rows 0…n−1 the filters ask on every decision (`has_eco`, `all_healthy`,
        `all_accepting`, `all_fresh`), kept by the writers below; None: to be looked up again.
        Whoever writes those columns directly calls `rows_written()`."""

    def _alloc(self, capacity: int) -> None:
        old = {name: getattr(self, name, None) for name in self.COLUMNS}
        for names, dtype in ((self._FLOAT, np.float64), (self._INT, np.int64), (self._BOOL, np.bool_)):
            for name in names:
                setattr(self, name, np.zeros(capacity, dtype=dtype))
        self.phase = np.zeros(capacity, dtype=np.int8)
        self.last_chosen[:] = -1
        for name, arr in old.items():
            if arr is not None:
                getattr(self, name)[: self.n] = arr[: self.n]

    def upsert(self, hb: Heartbeat, now: float) -> int:
        i = self.slot.get(hb.worker_id)
        if i is None:
            if self.n == len(self.running):
                self._alloc(max(1, 2 * self.n))
            i = self.n
            self.n += 1
            self.ids.append(hb.worker_id)
            self.macro.append(hb.macro_id)
            self.stats.append(hb.stats)
            self.slot[hb.worker_id] = i
            self.layout += 1
            self.rows_written()  # the new row's columns are what the slot held
            self.last_chosen[i] = -1
            self.accepting[i] = True
        s = hb.stats
        self.stats[i] = s
        self.model[i] = self.model_codes.setdefault(hb.model, len(self.model_codes))
        self.queued_prefill[i] = s.queued_prefill_tokens
        self.running[i] = s.running
        self.waiting[i] = s.waiting
        self.load[i] = s.running + s.waiting
        self.kv_used[i] = s.kv_blocks_used
        self.kv_free[i] = s.kv_blocks_free
        self.block_size[i] = s.block_size
        self.bs[i] = s.running
        self.step_ms[i] = s.step_time_ms
        healthy = hb.healthy and not hb.draining
        if self.healthy[i] != healthy:
            self.healthy[i] = healthy
            self._all_healthy = None
        self.phase[i] = PHASES.get(hb.phase, 0)
        stale = staleness.stale_after_s(hb.interval_s)
        if self.stale_s[i] != stale:
            self.stale_s[i] = stale
            self._one_stale_s = None
        self._seen(i, now)
        self.hb_decision[i] = self.decisions
        self.macro[i] = hb.macro_id
        self.slack_ms[i] = np.nan if s.tpot_slack_ms is None else s.tpot_slack_ms
        self.ms_per_token[i] = s.prefill_ms_per_token
        self.absorb[i] = absorb_tokens(s)
        self.vbs[i], self.min_stp_ms[i], self.vbs_limit[i] = s.vbs, s.min_tpot_slo_ms, s.vbs_limit
        return i

    def every_row(self) -> np.ndarray:
        """Rows 0…n−1 as an index array (the candidates when no filter narrows), kept between
        decisions while n stays and read-only, so no holder can change it for the next."""
        rows = self._every_row
        if len(rows) != self.n:
            rows = self._every_row = np.arange(self.n)
            rows.flags.writeable = False
        return rows

    def keepalive(self, worker_id: str, now: float) -> bool:
        """The row's latest heartbeat again, at `now`: the same as `upsert` with it, where no
        decision corrected the row since (else False, and nothing changes)."""
        i = self.slot.get(worker_id)
        if i is None or self.last_chosen[i] >= self.hb_decision[i]:
            return False
        self._seen(i, now)
        return True

    def _seen(self, i: int, now: float) -> None:
        """Row i heard from at `now`, the fleet's oldest time kept: it moves only when the row
        that held it is refreshed (then looked up again) or a time older than it comes."""
        low = self._min_seen
        if low is not None:
            if now < low:
                self._min_seen = now
            elif self.seen_s[i] == low:
                self._min_seen = None
        self.seen_s[i] = now

    def rows_written(self) -> None:
        """Forget the facts kept about the rows (after a direct write to their columns)."""
        self._has_eco = self._all_healthy = self._all_accepting = self._min_seen = self._one_stale_s = None

    def all_healthy(self) -> bool:
        """`healthy[:n].all()`, kept between decisions."""
        if self._all_healthy is None:
            self._all_healthy = bool(self.healthy[: self.n].all())
        return self._all_healthy

    def all_accepting(self) -> bool:
        """`accepting[:n].all()`, kept between decisions."""
        if self._all_accepting is None:
            self._all_accepting = bool(self.accepting[: self.n].all())
        return self._all_accepting

    def all_fresh(self, now: float, stale_after_s: float | None = None) -> bool:
        """`fresh(now, stale_after_s).all()` from the oldest row's time alone where every row
        has the same bound (the usual fleet): now − s is monotone in s (IEEE rounding is), so
        every row is fresh exactly when the oldest is."""
        if self.n == 0:
            return True
        bound = stale_after_s if stale_after_s is not None else self._shared_stale_s()
        if bound != bound:  # the rows' bounds differ: each row against its own
            return bool(self.fresh(now).all())
        if self._min_seen is None:
            self._min_seen = float(self.seen_s[: self.n].min())
        return (now - self._min_seen) <= bound

    def _shared_stale_s(self) -> float:
        if self._one_stale_s is None:
            col = self.stale_s[: self.n]
            self._one_stale_s = float(col[0]) if bool((col == col[0]).all()) else math.nan
        return self._one_stale_s

    def stats_of(self, worker_id: str) -> EngineStats | None:
        """The engine stats the worker last reported; None: no row for it."""
        i = self.slot.get(worker_id)
        return None if i is None else self.stats[i]

    def set_accepting(self, worker_id: str, accepting: bool) -> None:
        i = self.slot.get(worker_id)
        if i is not None and self.accepting[i] != accepting:
            self.accepting[i] = accepting
            self._all_accepting = None

    def set_ecoserve(self, worker_id: str, on: bool, ttft_slo_ms: float) -> None:
        i = self.slot.get(worker_id)
        if i is not None:
            self.eco[i] = on
            self.eco_ttft_ms[i] = ttft_slo_ms
            self._has_eco = None

    @property
    def has_eco(self) -> bool:
        """Some row belongs to an EcoServe macro-instance: `eco[:n].any()`, looked up again only
        after `set_ecoserve` or a row added or forgotten (the EcoServe guard asks on every
        decision)."""
        if self._has_eco is None:
            self._has_eco = bool(self.eco[: self.n].any())
        return self._has_eco

    def set_pd_decode(self, worker_id: str, on: bool) -> None:
        """The worker is a decode instance of a spatial P/D macro-instance."""
        i = self.slot.get(worker_id)
        if i is not None:
            self.pd_decode[i] = on

    def note_routed(self, i: int, new_tokens: int, new_blocks: int = 0) -> None:
        self.add_routed(i, new_tokens, new_blocks)
        self.last_chosen[i] = self.decisions
        self.decisions += 1

    def add_routed(self, i: int, new_tokens: int, new_blocks: int = 0) -> None:
        """A request on its way to row i's worker, on top of its heartbeat's figures (no
        decision counted: RouterCore.on_heartbeat adds back the offers still unanswered)."""
        self.waiting[i] += 1
        self.load[i] += 1
        self.bs[i] += 1
        self.queued_prefill[i] += new_tokens
        self.kv_used[i] += new_blocks

    def batch_size(self, rows: np.ndarray | slice) -> np.ndarray:
        """BS = running + routed since the last heartbeat."""
        return self.bs[rows]

    def fresh(self, now: float, stale_after_s: float | None = None) -> np.ndarray:
        """Rows heard from within their bound (`stale_s`), or within `stale_after_s` if given."""
        bound = self.stale_s[: self.n] if stale_after_s is None else stale_after_s
        return (now - self.seen_s[: self.n]) <= bound

    def forget_silent(self, now: float, forget_after_s: float) -> list[str]:
        """Drop rows of workers silent for longer than `forget_after_s` (swap-remove)."""
        gone = [self.ids[i] for i in range(self.n) if now - self.seen_s[i] > forget_after_s]
        for wid in gone:
            i, last = self.slot.pop(wid), self.n - 1
            if i != last:
                for name in self.COLUMNS:
                    arr = getattr(self, name)
                    arr[i] = arr[last]
                self.ids[i], self.macro[i], self.stats[i] = self.ids[last], self.macro[last], self.stats[last]
                self.slot[self.ids[i]] = i
            self.ids.pop()
            self.macro.pop()
            self.stats.pop()
            self.n -= 1
            self.layout += 1
            self.rows_written()
        return gone
