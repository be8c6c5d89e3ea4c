"""The service classes' SLOs: one table, imported by every service that judges time against a
class (admission's feasibility, the queue's deadlines and flow control, the router's TTFT
guard, the engines' deadline order). DESIGN.md §3.2:

    class           TTFT target   share   example
    P0 realtime     0.5 s         ~5 %    multi-turn chat, tool calls
    P1 online       5 s           ~60 %   API chat, summaries
    P2 batch        60 s          ~30 %   data processing
    P3 background   none          ~5 %    evals, distillation

A request's own `ttft_slo_ms` replaces its class's target. P3 has no target (infinity): it is
never refused for time, and ordered by arrival among its class wherever deadlines order a
line. A rule that needs a finite bound for every class (a guard's budget) takes
`FINITE_TTFT_TARGET_S`, where P3 gets the loosest finite target.
"""

from __future__ import annotations

import math

NUM_CLASSES = 4

TTFT_TARGET_S: tuple[float, ...] = (0.5, 5.0, 60.0, math.inf)
"""TTFT target of P0..P3, seconds."""

FINITE_TTFT_TARGET_S: tuple[float, ...] = tuple(
    t if math.isfinite(t) else max(x for x in TTFT_TARGET_S if math.isfinite(x)) for t in TTFT_TARGET_S
)
"""The same with P3 given P2's target (for rules that need a number for every class)."""

ENGINE_BACKLOG_S: float = min(TTFT_TARGET_S) / 2
"""The prefill backlog, in seconds of prefill, the queue's flow control lets an engine hold
(half the tightest target: 0.25 s); also the time a request still needs after it leaves the
queue, so a request with less than this left before its deadline can no longer meet it."""


def klass(priority: int) -> int:
    """A request's priority field → its class index 0..3 (out-of-range values clamp)."""
    return min(max(priority, 0), NUM_CLASSES - 1)


def ttft_target_s(priority: int) -> float:
    return TTFT_TARGET_S[klass(priority)]
