"""The pure terms of admission's predicted wait (feasibility.py's formulas, which its header
explains): which classes overtake a waiting request, the work ahead of it under each queue
policy, the wait at a drain with overtaking arrivals, the share of today's decodes still running
over a horizon, and the rate at which the queue's flow control can release work at all:

    R_w = min(H / a_w, kv_free_w) / i_w        the most prompt tokens per second to worker w
    (H = shared.slo.ENGINE_BACKLOG_S, a_w its prefill cost per token, i_w its heartbeat interval:
    the queue sends w no more than its room, judged from its heartbeat, and w's room opens
    again only with its next heartbeat; the whole prompt counts, cached or not.)
"""

from __future__ import annotations

import math

from tokenyard.shared.slo import ENGINE_BACKLOG_S

NUM_CLASSES = 4
WEIGHTS = (16.0, 8.0, 4.0, 2.0)
HYBRID_FAMILY = ("hybrid", "bubble", "bubble-placed", "fixed", "sjf")
ARRIVAL_WINDOW_S = 2.0
"""T: λ is measured over the admissions of the last T seconds (the queue's drain window, so λ
and D cover the same span), and overtaking work is counted for at most T of a wait."""


def overtaking(policy: str, c: int) -> range:
    """The classes whose later arrivals still go before a waiting class-c request: strict
    priority, every higher class; the hybrid family (and hybrid-wfq), P0, its strict tier (its
    fair tier orders P1 and P2 by release time, so a P1 that arrives later does not pass a
    waiting P2 whose release comes first; P3 has no deadline to judge); fcfs, wfq, drr: none
    counted (fcfs: nothing passes; wfq, drr: a later arrival passes only up to its share,
    which `work_ahead` already counts for the work waiting)."""
    if policy == "strict":
        return range(c)
    if policy in HYBRID_FAMILY or policy == "hybrid-wfq":
        return range(min(c, 1))
    return range(0)


def still_decoding(horizon_ms: float, life_ms: float) -> float:
    """k: over a horizon w, the mean share of today's decodes still running (each has a uniform
    share of its life L left: 1 − τ/L at τ) = 1 − w/2L (w ≤ L), L/2w (w > L); 1 − k is the mean
    share of its steady state that the decode population of the requests routed from now on has
    reached (min(τ, L)/L). w = ∞ or L = 0: 0 (the steady state)."""
    if math.isinf(horizon_ms) or life_ms <= 0:
        return 0.0
    x = max(horizon_ms, 0.0) / life_ms
    return 1.0 - x / 2 if x <= 1.0 else 1.0 / (2 * x)


def priority_wait(ahead: float, drain: float, overtaking_rate: float, counted_s: float = ARRIVAL_WINDOW_S) -> float:
    """The wait behind `ahead` work at `drain` > 0 while `overtaking_rate` work per second keeps
    arriving ahead of it, that arrival counted for no more than `counted_s` (T, the module's
    formula; ∞: over the whole wait, the textbook ahead / (D − λ))."""
    if overtaking_rate <= 0 or ahead <= 0:  # nothing ahead: released before anything can pass it
        return max(ahead, 0.0) / drain
    passed_by = ahead / (drain - overtaking_rate) if drain > overtaking_rate else math.inf
    return min(passed_by, (ahead + overtaking_rate * counted_s) / drain)  # counted_s = ∞: passed_by


def work_ahead(policy: str, work: list[float], c: int) -> float:
    if policy == "strict":
        return sum(work[: c + 1])
    if policy in ("wfq", "drr"):
        return work[c] + sum(min(work[k], work[c] * WEIGHTS[k] / WEIGHTS[c]) for k in range(NUM_CLASSES) if k != c)
    if policy in HYBRID_FAMILY:
        return sum(work) if c == 3 else sum(work[: c + 1])
    if policy == "hybrid-wfq":
        if c == 0:
            return work[0]
        if c == 3:
            return sum(work)
        o = 3 - c  # the other fair class: 1 ↔ 2
        return work[0] + work[c] + min(work[o], work[c] * WEIGHTS[o] / WEIGHTS[c])
    return sum(work)


def release_rate(prefill_ms_per_token: float, kv_free_tokens: int, interval_s: float) -> float:
    """R_w: the most prompt tokens per second the queue's flow control can release to a worker
    that reports this prefill cost, free KV and heartbeat interval: its whole room with nothing
    queued on it, min(H / a_w, kv_free_w) (services/priority_queue/core.py `_Worker.room`), once
    per heartbeat. Its decodes' TPOT slack can only lower the room (B_w = min(H, S_w)) and comes
    back as they finish: not counted, so R_w bounds what the queue releases from above.
    ∞: no prefill cost reported (flow control counts requests there, not tokens)."""
    if prefill_ms_per_token <= 0 or interval_s <= 0:
        return math.inf
    return max(min(ENGINE_BACKLOG_S * 1000.0 / prefill_ms_per_token, kv_free_tokens), 0) / interval_s
