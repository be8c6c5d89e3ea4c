"""SCORPIO's TPOT guarantee (seed 003, DESIGN §3.5) as a scheduling policy of the simulated
engine (scheduler.py's seam).

    STP(r)   = r's TPOT SLO (ms per output token; `default_stp_ms` when it sets none)
    TRP(r)   = min_{r' ∈ R} STP(r') / STP(r)          ∈ (0, 1]; 1 for the tightest
    VBS(R)   = Σ_{r ∈ R} TRP(r)                       the batch size credit batching makes
  * Admission (VBS-based): the waiting line is least-deadline-first (deadline = shared.slo.request_deadline_s:
    the one admission stamped, else arrival + its class's target); its head w joins the running set R
    only if EstimatedTPOT(VBS(R ∪ {w}), L_avg(R ∪ {w})) ≤ min_{R ∪ {w}} STP, where
    EstimatedTPOT(v, L) is the latency profile's decode step of v sequences of context L
    (linear between ⌊v⌋ and ⌈v⌉). A request whose SLO cannot be met waits rather than slow
    everyone; an empty engine always admits (someone must run). The seed rejects the requests
    it cannot serve in time: one still waiting, never started, whose first token can no longer
    come by its TTFT deadline leaves the engine rejected (finish reason `deadline`;
    SimEngineCore.expire; the prediction, which errs on keeping, is ttft_guard.py's with this
    policy's `prefill_step`).
  * Credit-based batching: each step every decoding request earns TRP(r) credit and runs in
    the step when its credit reaches 1, paying 1; so a request with twice the tightest SLO
    runs every other step, and the step's batch holds ≈ VBS decodes. Steps longer than min
    STP would starve the loose ones, so a request also runs when skipping could let the
    time since its last token pass its SLO (step_batch). Prefill chunks always run, after the
    decodes (`decodes_first`). When every running request has the same STP everyone runs
    every step (`folds`: the engine may fold such steps, core.advance).
  * Token budget: a step's tokens are capped so that the step, with the decodes its credit
    batch runs, fits the tightest running SLO (no minimum) whatever it schedules under the cap
    (priced at the most any step of at most that many tokens costs): prefill chunks shrink
    rather than stretch the tight requests' TPOT (the core asks `token_budget` before each step).
    A decode the batch skips bounds the step too: it must still have the next step's decodes'
    time left of its SLO (while the tightest request still prefills, nothing else bounds it).
  * Searches on step time (`prefill_step`, `vbs_limit`) find the largest count that fits,
    though step time is not monotone in tokens (`largest_within`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim import ttft_guard
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.scheduler import KeyedLine
from tokenyard.shared.slo import request_deadline_s

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import Seq, SimEngineCore



def deadline(seq: Seq) -> float:
    req = seq.req
    return request_deadline_s(req)


def ldf_key(seq: Seq, preempted: bool) -> tuple:
    """Preempted requests first (as vLLM puts them back at the head), then least deadline."""
    return (0, 0.0) if preempted else (1, deadline(seq))


def estimated_tpot_ms(prof: LatencyProfile, vbs: float, l_avg: float, at_least: bool = False) -> float:
    """The decode step of `vbs` sequences of context `l_avg` (fractional: interpolated);
    `at_least`: the least any larger batch costs (LatencyProfile.step_ms_at_least), monotone."""
    lo = math.floor(vbs)
    hi = math.ceil(vbs)
    price = prof.step_ms_at_least if at_least else prof.step_ms

    def step(b: int) -> float:
        return price(b, b, int(b * l_avg), 0.0) if b else 0.0

    if lo == hi:
        return step(lo)
    return step(lo) + (step(hi) - step(lo)) * (vbs - lo)


def largest_within(hi: int, cost: Callable[[int], float], floor: Callable[[int], float], bound: float) -> int:
    """The largest n in [0, hi] with cost(n) ≤ bound (0 when none does). The profile's step time
    is not monotone in its tokens (543 tokens of linear ops take 41.4 ms, 576 take 40.0 on
    a100-llama3-8b), so bisecting on cost can stop below a count that fits; `floor(n)`, at most
    cost(m) for every m ≥ n and monotone, is bisected instead — nothing past its answer fits —
    and the walk down from there stops at the first count that really fits."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if floor(mid) <= bound:
            lo = mid
        else:
            hi = mid - 1
    while lo > 0 and cost(lo) > bound:
        lo -= 1
    return lo


def decodes_first(running: list[Seq]) -> list[Seq]:
    """`running` with its decodes ahead of its prefill chunks (itself when they are already).
    The token budget counts one token for each decode of the batch and gives the rest to the
    chunks; the core fills the budget in the batch's order, so a chunk ahead of a decode (one
    admitted while a long prompt still prefilled, as vLLM's long_prefill_token_threshold lets
    happen) would take its token and leave it waiting past its SLO."""
    seen_chunk = False
    for r in running:
        if r.computed < r.target:
            seen_chunk = True
        elif seen_chunk:
            return [r for r in running if r.computed >= r.target] + [r for r in running if r.computed < r.target]
    return running


class ScorpioPolicy:
    guards_tpot = True
    """Its token budget keeps every step within the running decodes' SLOs (SchedulingPolicy)."""
    class_ordered = False
    """Its line goes by deadline, and its credit batch runs a subset of the running."""

    def __init__(self, prof: LatencyProfile, default_stp_ms: float = 100.0, reject: bool = True) -> None:
        self.prof = prof
        self.rejects_past_deadline = reject
        """The seed's rejection path (SimEngineCore.expire): a request the VBS check kept waiting
        past its TTFT deadline is rejected, not served late."""
        self.default_stp_ms = default_stp_ms
        self._plan: tuple[list[int], tuple[list[Seq], dict[str, float], dict[str, float]]] | None = None
        """(ids of the running set, its credit batch) between `token_budget` and `step_batch`."""
        self.credits: dict[str, float] = {}
        self.gap_ms: dict[str, float] = {}
        """Per decoding request the last credit batch saw: time since its last token as that
        step started (`gap`)."""
        self._ran: set[str] = set()
        self._last_step_ms = 0.0
        self._next_ms = 0.0
        """What a decode the credit batch skips must have left of its SLO as the step ends (the
        next step's decodes at their most, `next_decodes_ms`, and the live overhead)."""
        self._copies_ms = 0.0
        """The host-tier copies the step may make (they lengthen it beyond its budget's tokens)."""
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
        """The step's token budget: the most tokens whose step, with the decodes this step's
        credit batch really runs (their own contexts), still ends within the SLO of each of them
        (the tightest: its STP; a loose one that skipped steps: its STP less the time since its
        last token) — priced as an upper bound on any step of at most that many tokens: the
        linear ops at their most for any count up to it (LatencyProfile.step_ms_at_most: the
        step may schedule fewer, and the measured linear(T) is not monotone), the attention of
        one chunk of all the prompt tokens on the longest cached context a chunk may sit on,
        plus p0 for each further chunk the tokens can make (the running prefills', and the
        waiting requests' smallest whole prompts that fit, and one more). A live engine's
        measured per-step overhead (`SimEngineCore.step_overhead_s`) comes off the bound and
        onto each step's time. A decode the credit batch skips bounds the step at its STP less
        its gap less the next step's decodes at their most (`next_decodes_ms`): whichever later
        step runs it, each step before leaves it that much. A step with no decode, run or
        skipped, takes the full budget. A prefix the window's requests would copy back from the
        host tier lengthens the step by the copy (admit.py): it comes off the bound too."""
        over = core.step_overhead_s * 1000.0  # live: what a step costs beyond its modelled time
        self._last_step_ms = core.last_step_s * 1000.0 + over
        self._core = core
        prof = self.prof
        full = prof.max_num_batched_tokens
        running = core.running
        if all(r.computed < r.target for r in running):  # no decode to guard
            return full
        # a step admits from the line's first `lookahead` (its gate's window, which moves on by
        # one per admission): twice that covers every request it can start
        window = core.waiting.ordered()[: 2 * core.waiting.lookahead] if core.waiting else []
        todo = [(*ttft_guard.uncached(core, w), w.target) for w in window]
        copies = sum(prof.transfer_s(h) for _, h, _ in todo if h) * 1000.0
        if self.folds(running):  # everyone runs: one that skipped the steps before still has its gap
            batch, gaps = running, {r.rid: self.gap(r) for r in running}
        else:
            self._copies_ms = copies
            self._next_ms = self.next_decodes_ms(running, todo) + over
            batch, _, gaps = self._planned(running)
        decodes = [r for r in batch if r.computed >= r.target]
        runs = {id(r) for r in decodes}
        skipped = [r for r in running if r.computed >= r.target and id(r) not in runs]
        d = len(decodes)
        ctx = sum(self.context(r) for r in decodes)
        prefilling = [r for r in running if r.computed < r.target]
        waiting = sorted(u for u, _, _ in todo)
        # a decode the credit batch skips gets its token in a later step: this one must leave
        # it room for the next one's decodes (when the tightest is still prefilling the batch may
        # hold no decode at all, and nothing else bounds the step)
        left = [self.stp(r) - gaps.get(r.rid, 0.0) for r in decodes]
        left += [self.stp(r) - gaps[r.rid] - self._next_ms for r in skipped]
        bound = min(left) - over - copies
        # the longest context a chunk may sit on: a prefilling request's, or a waiting one's cached prefix
        k = max([r.computed for r in prefilling] + [t - u for u, _, t in todo], default=0)

        def cost(n: int, chunks: int) -> float:
            # m chunks of n tokens in all cost at most m·p0 + p1·n + p2·n²/2 + p3·n·k (Σ n_i² ≤ n²)
            attn = prof.chunk_attn_ms(n, k) + (chunks - 1) * prof.p0 if n else 0.0
            # at most: the step may run fewer tokens (a last chunk short of the budget), and
            # the profile's linear(T) is not monotone — fewer tokens can cost more
            return prof.step_ms_at_most(d + n, d, ctx, attn)

        def fits(n: int, chunks: int) -> bool:
            return cost(n, chunks) <= bound

        def largest(chunks: int) -> int:
            lo, hi = 0, full - d
            if fits(hi, chunks):
                return hi
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if fits(mid, chunks):
                    lo = mid
                else:
                    hi = mid - 1
            return lo

        def chunks_for(n: int) -> int:
            # every chunk but the last that starts a request is its whole uncached prompt: at most
            # the most smallest waiting prompts that sum below n, and one more
            total, m = 0, 0
            for u in waiting:
                if total + u >= n:
                    break
                total += u
                m += 1
            return len(prefilling) + min(m + 1, len(waiting))

        chunks = len(prefilling) + 1
        lo = largest(chunks)
        while (need := chunks_for(lo)) > chunks:  # more chunks, fewer tokens: it settles
            chunks = need
            lo = largest(chunks)
        return max(d + lo, 1)  # never a step of nothing: the engine would stall (_planned's rule leaves a token room)

    def next_decodes_ms(self, running: list[Seq], todo: list[tuple[int, int, int]]) -> float:
        """The most the decodes of the step after this one can cost with no prompt token beside
        them (the live overhead aside): every running request a decode by then (a prefilling one
        may finish its prompt in this step), and as many of the window's requests (`todo`:
        uncached, copied, target) as can prefill their whole prompts in this one step, each at
        its largest context; linear at its ceiling. A decode this step skips must have that much
        of its SLO left when this step ends."""
        full = self.prof.max_num_batched_tokens
        n = len(running)
        ctx = sum(max(self.context(r), r.target) + 1 for r in running)
        whole = sorted((u, t + 1) for u, _, t in todo if u <= full)
        m, total = 0, 0
        for u, _ in whole:
            if total + u > full:
                break
            total += u
            m += 1
        ctx += sum(sorted((t for _, t in whole), reverse=True)[:m])
        return self.prof.step_ms_at_most(n + m, n + m, ctx, 0.0)

    def prefill_step(self, core: SimEngineCore, decodes: list[Seq]) -> tuple[int, float]:
        """The TTFT guard's optimistic step beside `decodes` (ttft_guard.py): the most prompt
        tokens of one chunk on no cached context that fit min STP(decodes) beside ⌊VBS⌋ decodes
        at their TRP-weighted mean context (credit batching runs ≈ VBS a step, each in proportion
        to its TRP), and the step's seconds, the live overhead in — no gap, no copy, no second
        chunk: as fast as a step beside these decodes can prefill. None: vLLM's full step."""
        if not decodes:
            return ttft_guard.full_step(core, decodes)
        prof = self.prof
        over = core.step_overhead_s * 1000.0
        vbs, tight = self.vbs(decodes)
        d = max(1, math.floor(vbs + 1e-9))
        ctx = sum(tight / self.stp(r) * self.context(r) for r in decodes) * d / vbs
        bound = tight - over

        def step(n: int) -> float:
            return prof.step_ms(d + n, d, ctx, prof.chunk_attn_ms(n, 0) if n else 0.0)

        def floor(n: int) -> float:
            return prof.step_ms_at_least(d + n, d, ctx, prof.chunk_attn_ms(n, 0) if n else 0.0)

        n = largest_within(max(0, prof.max_num_batched_tokens - d), step, floor, bound)
        return n, (step(n) + over) / 1000.0

    def _planned(self, running: list[Seq]) -> tuple[list[Seq], dict[str, float], dict[str, float]]:
        """The credit batch of `running` for the coming step (computed once a step, kept for
        `step_batch`): (batch, credits after it, each decode's time since its last token)."""
        key = [id(r) for r in running]
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        # two steps ahead (this one, then the next, where a skipped decode runs at the latest)
        # each at least as long as the last and as the next one's decodes (its budget's bound)
        ahead = 2 * max(self._last_step_ms, self._next_ms) + self._copies_ms
        tight = min(self.stp(r) for r in running)
        batch: list[Seq] = []
        chunks: list[Seq] = []
        credits: dict[str, float] = {}
        gaps: dict[str, float] = {}
        for r in running:
            if r.computed < r.target:  # prefilling: its chunk runs
                chunks.append(r)
                continue
            stp = self.stp(r)
            c = self.credits.get(r.rid, 0.0) + tight / stp
            gap = self.gap(r)
            if c >= 1.0 - 1e-9 or gap + ahead > stp:
                c = max(0.0, c - 1.0)
                batch.append(r)
            credits[r.rid] = c
            gaps[r.rid] = gap
        plan = (batch + chunks, credits, gaps)  # decodes first (decodes_first)
        self._plan = (key, plan)
        return plan

    def gap(self, seq: Seq) -> float:
        """Time since `seq`'s last token as the coming step starts (ms): its gap as the last
        step started plus that step where that step's credit batch skipped it; else 0 — the
        last step ran it, or it joined the engine in that step (its first token, or a swapped
        decode's resumed one, came at the step's end)."""
        if seq.rid in self._ran or seq.rid not in self.gap_ms:
            return 0.0
        return self.gap_ms[seq.rid] + self._last_step_ms

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        """Credit-based batching: each step every decoding request earns TRP(r) and runs once
        its credit reaches 1, paying 1 (the tightest, TRP = 1, runs every step). On the
        engine's real clock a step may take longer than min STP, so a request also runs when
        skipping could let the time since its last token pass its SLO before its next
        chance: gap_r + 2·max(s, n) + c > STP(r), s the last step's duration, n the next
        step's decodes at their most (`next_decodes_ms`), c the step's host-tier copies — the
        token budget then holds the step to STP(r) − gap_r − n for each one skipped. The batch
        `token_budget` priced, when the running set is still the one it saw; decodes first."""
        if self.folds(running):
            self.credits, self.gap_ms, self._plan = {}, {}, None
            return decodes_first(running)
        batch, self.credits, self.gap_ms = self._planned(running)
        self._plan = None
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
        """The largest VBS (to 1/16) whose estimated TPOT meets `tight` (the estimate is not
        monotone in VBS: `largest_within`)."""
        prof = self.prof
        n = largest_within(
            16 * prof.max_num_seqs,
            lambda i: estimated_tpot_ms(prof, i / 16, l_avg),
            lambda i: estimated_tpot_ms(prof, i / 16, l_avg, at_least=True),
            tight,
        )
        return n / 16

    def heartbeat_fields(self, core: SimEngineCore) -> dict[str, float]:
        """What the worker's heartbeat carries for the router's VBS filter."""
        if not core.running:
            return {}
        vbs, tight = self.vbs(core.running)
        l_avg = sum(self.context(s) for s in core.running) / len(core.running)
        return {"vbs": vbs, "min_tpot_slo_ms": tight, "vbs_limit": self.vbs_limit(tight, l_avg)}
