"""The service classes' SLOs: one table, imported by every service that judges time against a
class (admission's feasibility, the queue's deadlines and flow control, the router's TTFT
guard, the engines' deadline order). docs/ARCHITECTURE.md §3:

    class           TTFT target   share   example
    P0 realtime     0.5 s         ~5 %    multi-turn chat, tool calls
    P1 online       5 s           ~60 %   API chat, summaries
    P2 batch        60 s          ~30 %   data processing
    P3 background   none          ~5 %    evals, distillation

A class target bounds the wait the fleet imposes; a request's TTFT deadline adds its own
predicted prefill (`ttft_deadline_s`), capped at `deadline_cap_s` (P0 0.87 s, P1 8.7 s, P2 104 s),
so no admitted TTFT passes TTFT_BOUND × its class target; a prompt whose prefill cannot fit
the cap with CLASS_MARGIN_S to spare is refused (400; `fits_class`, `longest_prompt` per
profile). The claim's limits: an explicit `ttft_slo_ms` is the client's own whole-TTFT target,
not capped by the class; the prediction is the fleet's measured prefill cost (the whole prompt,
a cached history too), 0 while no worker has measured one (a fresh vLLM worker reports 0), so
nothing is refused until one has; vLLM reports no quadratic (attention) term, so a long
prompt is under-predicted there; TTFT_OVERSHOOT was measured on single-profile simulated
fleets. P3 has no target (infinity): it is
never refused for time, and ordered by arrival among its class wherever deadlines order a
line. A rule that needs a finite bound for every class (a guard's budget) takes
`FINITE_TTFT_TARGET_S`, where P3 gets the loosest finite target.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tokenyard.shared.schemas import AdmittedRequest

NUM_CLASSES = 4

TTFT_TARGET_S: tuple[float, ...] = (0.5, 5.0, 60.0, math.inf)
"""TTFT target of P0..P3, seconds."""

FINITE_TTFT_TARGET_S: tuple[float, ...] = tuple(
    t if math.isfinite(t) else max(x for x in TTFT_TARGET_S if math.isfinite(x)) for t in TTFT_TARGET_S
)
"""The same with P3 given P2's target (for rules that need a number for every class)."""

DEFAULT_TPOT_SLO_MS: float = 100.0
"""The TPOT SLO of a request that names none (`tpot_slo_ms` 0 or absent), every class alike:
what an engine's decode slack (the decode term) and SCORPIO hold a decode to."""

TTFT_BOUND: float = 2.0
"""No admitted request's TTFT above TTFT_BOUND × its class target (issue 11's figure)."""

TTFT_OVERSHOOT: float = 1.15
"""The most an admitted request's TTFT overshoots its own deadline (TTFT ÷ deadline, from
arrival), as measured with deadlines capped at TTFT_BOUND × target (no margin) on the runs
the cap was tuned on (Mooncake ×1.5 and ×3, ChatBot ×3 on 16 and ×6 on 8 instances: at most
1.13, rounded up to 0.05): deadlines are capped at TTFT_BOUND ÷ this × the class target
(`deadline_cap_s`). docs/results-priorities.md, Round 11."""

ENGINE_BACKLOG_S: float = min(TTFT_TARGET_S) / 2
"""The prefill backlog, in seconds of prefill, the queue's flow control lets an engine hold
(half the tightest target: 0.25 s); also the time a request still needs after it leaves the
queue, so a request with less than this left before its deadline can no longer meet it."""


def prefill_budget_s(tpot_slack_s: float | None) -> float:
    """The prefill backlog, in seconds of prefill, an engine may hold: ENGINE_BACKLOG_S, and no
    more than its running decodes can absorb within their TPOT SLO — the tightest decode's saved
    slack (shared.ecoserve.saved_slack_ms; None: nothing decodes). Every step that carries a
    prefill chunk delays each decode's next token by the chunk's time, so a backlog beyond the
    slack pushes a decode past its TPOT SLO; the queue's flow control and the worker's
    `saturated` refusal both hold prefill back to this."""
    return ENGINE_BACKLOG_S if tpot_slack_s is None else min(ENGINE_BACKLOG_S, tpot_slack_s)


class OfferPrefill(NamedTuple):
    """What the router tells a worker with an offer (header subjects.OFFER_PREFILL_HEADER,
    "here,elsewhere"): the request's uncached prompt tokens on that worker and the fewest on any
    other instance, from its block index. The worker's `saturated` refusal weighs them
    (engine_saturated's `own_s` and `elsewhere_s`)."""

    here: int
    elsewhere: int

    def header(self) -> str:
        return f"{self.here},{self.elsewhere}"

    @classmethod
    def parse(cls, value: str | None) -> OfferPrefill | None:
        """The header's value; None when absent or malformed (the refusal then ignores it)."""
        if not value:
            return None
        parts = value.split(",")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 12 for p in parts):
            return None  # not two plain counts (signs, '_', spaces, other digits, huge: a hostile header)
        return cls(int(parts[0]), int(parts[1]))


def engine_saturated(ahead_s: float, backlog_s: float, tpot_slack_s: float | None,
                     own_s: float = 0.0, elsewhere_s: float | None = None) -> bool:
    """Whether an engine should refuse a new request (the worker's `saturated`), from seconds of
    prefill at its rate:

        saturated  =  (ahead_s > ENGINE_BACKLOG_S  or  backlog_s > tpot_slack_s)
                      and  not  ahead_s + own_s < elsewhere_s

    `ahead_s` is the prefill the request would wait behind in the engine's order — vLLM's
    priority order runs every running request's chunk first, then the waiting line by (class,
    arrival), so a class-c request waits behind the running prefills and the waiting ones of
    classes ≤ c, not behind a lower class's; each waiting one net of the prefix it finds
    cached (EngineStats.queued_prefill_ahead_net where reported). `backlog_s` is all the
    prefill the engine holds: each of its tokens runs beside the running decodes, so the
    decode term bounds the whole (prefill_budget_s). With ahead = backlog and no counts this
    is `backlog_s > prefill_budget_s(tpot_slack_s)`. So a P0 joins an engine whose backlog is
    released P1/P2 work it would overtake anyway.

    The router's counts weigh where the prefill goes instead (round 9 for the decode term,
    round 10 for both): `own_s` is the request's own uncached prefill here and `elsewhere_s`
    the least it would prefill on any other instance (the router's index: the best other
    holder's recompute, at this engine's rate; None: not known, the terms alone decide). A
    holder takes the request when its first token comes here, queue and all, before its bare
    recompute could end anywhere else: refusing would put more prefill (≥ elsewhere > own)
    beside some other engine's decodes and delay the request too — the live ×1 tail was
    such holders refusing on the ahead term (docs/results-routing.md, round 10). A request
    that recomputes alike everywhere (nothing cached: a burst's prompts) is refused as
    before, so under overload the queue still keeps the order of the fleet's backlog."""
    if elsewhere_s is not None and ahead_s + own_s < elsewhere_s:
        return False
    return ahead_s > ENGINE_BACKLOG_S or (tpot_slack_s is not None and backlog_s > tpot_slack_s)


def decode_slack_s(hb) -> float | None:
    """A heartbeat's TPOT slack for the decode term (seconds; None: no bound). Only a worker in
    the mixed phase runs its prefills beside its decodes; a spatial P/D prefill worker hands its
    requests off and an EcoServe phase worker runs one phase at a time, so theirs is None."""
    if hb.phase != "mixed" or hb.stats.tpot_slack_ms is None:
        return None
    return hb.stats.tpot_slack_ms / 1000.0


def klass(priority: int) -> int:
    """A request's priority field → its class index 0..3 (out-of-range values clamp)."""
    return min(max(priority, 0), NUM_CLASSES - 1)


def ttft_target_s(priority: int) -> float:
    return TTFT_TARGET_S[klass(priority)]


def deadline_cap_s(priority: int) -> float:
    """The longest TTFT deadline a class-`priority` request gets (from arrival; infinity for P3):
    TTFT_BOUND × its target ÷ TTFT_OVERSHOOT, so that a TTFT that overshoots its deadline by
    the most measured still stays within TTFT_BOUND × the target."""
    return ttft_target_s(priority) * TTFT_BOUND / TTFT_OVERSHOOT


def ttft_deadline_s(arrival_s: float, priority: int, ttft_slo_ms: float | None = None,
                    prefill_s: float = 0.0) -> float:
    """A request's TTFT deadline (absolute, seconds; infinity: none), the one definition every
    service and the simulator use (admission's wait check stamps it on the request; the queue's
    deadline order and rejection, and the engines' deadline order, read it back):

        deadline = arrival + ttft_slo_ms / 1000                                the client's own bound
                 = arrival + min(target(class) + prefill_s, deadline_cap_s)    otherwise

    A class target bounds the wait the fleet imposes, not the compute the prompt needs: a 15k-
    token P1 prompt whose prefill takes 2 s gets 5 s of wait besides. But no deadline passes
    deadline_cap_s (TTFT_BOUND × target ÷ TTFT_OVERSHOOT: P0 0.87 s, P1 8.7 s, P2 104 s), so no
    admitted request is served later than TTFT_BOUND × its class target (given a TTFT within
    TTFT_OVERSHOOT × its deadline, as measured on single-profile simulated fleets): a prompt
    whose own prefill does not fit the cap with CLASS_MARGIN_S to spare (`fits_class`) is
    refused at admission (400 slo_infeasible; a higher-numbered class or a ttft_slo_ms) and one
    that waits past it leaves the queue (429 deadline_exceeded). `prefill_s` is the request's
    own prefill as predicted (the fastest fresh worker, whole prompt, cached history too; 0
    when unknown, which caps nothing). An explicit `ttft_slo_ms` is the client's own target,
    not capped by the class, and means what the API says, a TTFT after admission, prefill
    included, so a prompt that cannot be prefilled within it is refused (400 slo_infeasible).
    """
    if ttft_slo_ms is not None:
        return arrival_s + ttft_slo_ms / 1000.0
    return arrival_s + min(ttft_target_s(priority) + prefill_s, deadline_cap_s(priority))


CLASS_MARGIN_S: float = 2 * ENGINE_BACKLOG_S
"""What a class-capped request must have to spare besides its own prefill to be admitted (0.5 s):
H for the engine backlog it may wait behind once released (`latest_release_s`), and another H
to be released at all — the queue's flow control releases into an engine only while its
prefill backlog is under H, so on a fleet with work in flight the head waits up to one such
backlog's drain for room. With only H, a prompt just under the cap was admitted with ~0 s to
wait and expired before its first dispatch (a 429 loop): round 11's review."""


def fits_class(prefill_s: float, priority: int) -> bool:
    """Whether a prompt of this own prefill may be admitted at this class: prefill + CLASS_MARGIN_S
    within deadline_cap_s (always for P3). Beyond it no wait can make the deadline: a 400."""
    return prefill_s + CLASS_MARGIN_S <= deadline_cap_s(priority)


def longest_prompt(a_ms: float, b_ms: float, priority: int) -> int | None:
    """The longest prompt `fits_class` admits at this class on a worker whose prefill costs
    L·a_ms + L²·b_ms ms (its heartbeat's prefill_ms_per_token, _2); None: no limit (P3, or a
    worker that has measured nothing). What docs/results-priorities.md Round 11 tabulates."""
    room_ms = (deadline_cap_s(priority) - CLASS_MARGIN_S) * 1000.0
    if math.isinf(room_ms) or a_ms <= 0 and b_ms <= 0:
        return None
    if room_ms < 0:
        return 0
    n = int(room_ms / a_ms) if b_ms <= 0 else int((-a_ms + math.sqrt(a_ms * a_ms + 4 * b_ms * room_ms)) / (2 * b_ms))
    while n > 0 and not fits_class((n * a_ms + n * n * b_ms) / 1000.0, priority):
        n -= 1
    while fits_class(((n + 1) * a_ms + (n + 1) ** 2 * b_ms) / 1000.0, priority):
        n += 1
    return n


def min_ttft_slo_ms(prefill_s: float) -> int:
    """The least ttft_slo_ms, rounded up to 100 ms, that admission accepts for a prompt of this own
    prefill (prefill + ENGINE_BACKLOG_S within it, compared as admission does, in seconds)."""
    ms = math.ceil((prefill_s + ENGINE_BACKLOG_S) * 10) * 100
    while prefill_s + ENGINE_BACKLOG_S > ms / 1000.0:  # float rounding: never suggest a refused value
        ms += 100
    return ms


def latest_release_s(deadline_s: float, prefill_s: float) -> float:
    """The last moment a request may leave the queue and still meet its deadline: it then
    waits up to ENGINE_BACKLOG_S in its engine, then needs its own prefill."""
    return deadline_s - prefill_s - ENGINE_BACKLOG_S


def request_deadline_s(req: AdmittedRequest) -> float:
    """An admitted request's TTFT deadline: the one admission stamped, else (a request made
    without admission: tests, direct engine use) its class target from arrival."""
    return req.deadline_s if req.deadline_s > 0 else ttft_deadline_s(req.arrival_s, req.priority)
