"""SCORPIO's TPOT guarantee (seed 003, DESIGN §3.5) as a scheduling policy of the simulated
engine (scheduler.py's seam).

    STP(r)   = r's TPOT SLO (ms per output token; `default_stp_ms` when it sets none)
    TRP(r)   = min_{r' ∈ R} STP(r') / STP(r)          ∈ (0, 1]; 1 for the tightest
    VBS(R)   = Σ_{r ∈ R} TRP(r)                       the batch size credit batching makes
  * Admission (VBS-based): the waiting line is least-deadline-first (deadline = the client's
    TTFT deadline, else arrival + its class's target); its head w joins the running set R
    only if EstimatedTPOT(VBS(R ∪ {w}), L_avg(R ∪ {w})) ≤ min_{R ∪ {w}} STP, where
    EstimatedTPOT(v, L) is the latency profile's decode step of v sequences of context L
    (linear between ⌊v⌋ and ⌈v⌉). A request whose SLO cannot be met waits rather than slow
    everyone; an empty engine always admits (someone must run). The seed rejects the requests
    it cannot serve in time: one still waiting, never started, once its TTFT deadline has
    passed leaves the engine rejected (finish reason `deadline`; SimEngineCore.expire).
  * Credit-based batching: each step every decoding request earns TRP(r) credit and runs in
    the step when its credit reaches 1, paying 1; so a request with twice the tightest SLO
    runs every other step, and the step's batch holds ≈ VBS decodes. Steps longer than min
    STP would starve the loose ones, so a request also runs when skipping could let the
    time since its last token pass its SLO (step_batch). Prefill chunks always run. When
    every running request has the same STP everyone runs every step (`folds`: the engine
    may fold such steps, core.advance).
  * Token budget: a step's tokens are capped so that the step, with its ≈ VBS decodes, fits
    the tightest running SLO (at least `min_budget`): prefill chunks shrink rather than
    stretch the tight requests' TPOT (the core asks `token_budget` before each step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.scheduler import KeyedLine
from tokenyard.shared.slo import ttft_target_s

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import Seq, SimEngineCore



def deadline(seq: Seq) -> float:
    req = seq.req
    return req.deadline_s if req.deadline_s > 0 else req.arrival_s + ttft_target_s(req.priority)


def ldf_key(seq: Seq, preempted: bool) -> tuple:
    """Preempted requests first (as vLLM puts them back at the head), then least deadline."""
    return (0, 0.0) if preempted else (1, deadline(seq))


def estimated_tpot_ms(prof: LatencyProfile, vbs: float, l_avg: float) -> float:
    """The decode step of `vbs` sequences of context `l_avg` (fractional: interpolated)."""
    lo = math.floor(vbs)
    hi = math.ceil(vbs)

    def step(b: int) -> float:
        return prof.step_ms(b, b, int(b * l_avg), 0.0) if b else 0.0

    if lo == hi:
        return step(lo)
    return step(lo) + (step(hi) - step(lo)) * (vbs - lo)


class ScorpioPolicy:
    def __init__(self, prof: LatencyProfile, default_stp_ms: float = 100.0, min_budget: int = 64,
                 reject: bool = True) -> None:
        self.prof = prof
        self.rejects_past_deadline = reject
        """The seed's rejection path (SimEngineCore.expire): a request the VBS check kept waiting
        past its TTFT deadline is rejected, not served late."""
        self.default_stp_ms = default_stp_ms
        self.min_budget = min_budget
        self.credits: dict[str, float] = {}
        self.gap_ms: dict[str, float] = {}
        """Per decoding request: time since its last token, as far as the engine's steps tell."""
        self._ran: set[str] = set()
        self._last_step_ms = 0.0
        self._core: SimEngineCore | None = None
        self.refused = 0
        """Admission checks that found the head infeasible (it waited)."""

    def stp(self, seq: Seq) -> float:
        return seq.req.tpot_slo_ms or self.default_stp_ms

    @staticmethod
    def context(seq: Seq) -> int:
        return seq.req.prompt_len + seq.generated

    # ── the seam ──
    def new_waiting_line(self) -> KeyedLine:
        return KeyedLine(ldf_key, self._gate)

    def due_victims(self, core: SimEngineCore) -> Sequence[Seq]:
        return ()

    def _gate(self, seq: Seq) -> bool:
        return self._core is None or self.feasible(seq, self._core)

    def folds(self, running: list[Seq]) -> bool:
        return len({self.stp(s) for s in running}) <= 1

    def token_budget(self, core: SimEngineCore) -> int:
        """The step's token budget: the most tokens whose step still fits the tightest running
        SLO, with ≈ VBS decodes in it (at least `min_budget`, so prefill always advances)."""
        self._last_step_ms = core.last_step_s * 1000.0
        self._core = core
        full = self.prof.max_num_batched_tokens
        decoding = [s for s in core.running if s.computed >= s.target]
        if not decoding:
            return full
        vbs, tight = self.vbs(decoding)
        b = max(1, math.ceil(vbs))
        ctx = int(b * sum(self.context(s) for s in decoding) / len(decoding))
        prof = self.prof

        def fits(n: int) -> bool:
            return prof.step_ms(b + n, b, ctx, prof.chunk_attn_ms(n, 0) if n else 0.0) <= tight

        lo, hi = 0, full - b
        if fits(hi):
            return full
        while lo < hi:  # the largest n that fits
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return max(self.min_budget, b + lo)

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        """Credit-based batching: each step every decoding request earns TRP(r) and runs once
        its credit reaches 1, paying 1 (the tightest, TRP = 1, runs every step). On the
        engine's real clock a step may take longer than min STP, so a request also runs when
        skipping could let the time since its last token pass its SLO before its next
        chance: gap_r + 2·s > STP(r), s the last step's duration."""
        if self.folds(running):
            self.credits, self.gap_ms = {}, {}
            return running
        s = self._last_step_ms
        tight = min(self.stp(r) for r in running)
        batch: list[Seq] = []
        credits: dict[str, float] = {}
        gaps: dict[str, float] = {}
        for r in running:
            if r.computed < r.target:  # prefilling: its chunk runs
                batch.append(r)
                continue
            stp = self.stp(r)
            c = self.credits.get(r.rid, 0.0) + tight / stp
            gap = 0.0 if r.rid in self._ran else self.gap_ms.get(r.rid, 0.0) + s
            if c >= 1.0 - 1e-9 or gap + 2 * s > stp:
                c = max(0.0, c - 1.0)
                batch.append(r)
            credits[r.rid] = c
            gaps[r.rid] = gap
        self.credits, self.gap_ms = credits, gaps
        self._ran = {r.rid for r in batch}
        return batch

    def vbs(self, seqs: Sequence[Seq]) -> tuple[float, float]:
        """(VBS, min STP) of a set of requests; (0, 0) for none."""
        if not seqs:
            return 0.0, 0.0
        tight = min(self.stp(s) for s in seqs)
        return sum(tight / self.stp(s) for s in seqs), tight

    def feasible(self, seq: Seq, core: SimEngineCore) -> bool:
        """EstimatedTPOT(VBS(R ∪ {w}), L_avg) ≤ min STP (an empty engine always admits)."""
        if not core.running:
            return True
        group = [*core.running, seq]
        vbs, tight = self.vbs(group)
        l_avg = sum(self.context(s) for s in group) / len(group)
        return estimated_tpot_ms(self.prof, vbs, l_avg) <= tight

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        self._core = core
        if self.feasible(seq, core):
            return True
        self.refused += 1
        return False

    def vbs_limit(self, tight: float, l_avg: float) -> float:
        """The largest VBS (to 1/16) whose estimated TPOT meets `tight`."""
        lo, hi = 0, 16 * self.prof.max_num_seqs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if estimated_tpot_ms(self.prof, mid / 16, l_avg) <= tight:
                lo = mid
            else:
                hi = mid - 1
        return lo / 16

    def heartbeat_fields(self, core: SimEngineCore) -> dict[str, float]:
        """What the worker's heartbeat carries for the router's VBS filter."""
        if not core.running:
            return {}
        vbs, tight = self.vbs(core.running)
        l_avg = sum(self.context(s) for s in core.running) / len(core.running)
        return {"vbs": vbs, "min_tpot_slo_ms": tight, "vbs_limit": self.vbs_limit(tight, l_avg)}
