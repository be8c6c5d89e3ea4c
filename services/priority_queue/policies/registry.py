"""Every queue policy by name: what `tokenyard queue --policy` and `tokenyard sim
--queue-policy` build. `make_policy(name, **knobs)`; unknown knobs are an error, knobs a
policy does not use are ignored (so one set of options serves every policy).

    fcfs     arrival order                          (baseline)
    strict   class first, no aging                  (baseline: starves under P0 load)
    drr      deficit round robin over classes, in tokens, weights 8/4/2/1
    wfq      weighted fair queueing over all classes, weights 16/8/4/2
    hybrid   P0 strict · P1-P2 deadline-first, WFQ between heads without one · P3 best
             effort · aging                                        (default; hybrid.py)
    hybrid-wfq  P0 strict · P1-P2 WFQ · P3 best effort · aging     (DESIGN §3.3 as written)
    bubble   hybrid, with bubble queues within each class          (seed 004; a longer length
             range yields its turn to shorter ones until its head has waited twice its TTFT
             span, bubble.py)
    bubble-placed  the same, each length range released onto instances of its own, split by
             demand, idle longer ranges lent to shorter ones (seed 004's queues with capacity
             of their own; bubble_placement.py; docs/results-bubble.md: better short p50 in
             a short flood, worse long p99 without one, so not the default bubble)
    fixed    hybrid, with fixed log-spaced length partitions       (baseline for bubble)
    sjf      hybrid, shortest job first within each class          (baseline for bubble)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from tokenyard.services.priority_queue.policies.base import AGING_S, WFQ_WEIGHTS, QueuePolicy
from tokenyard.services.priority_queue.policies.bubble import BASE_BOUNDS, BubbleLine
from tokenyard.services.priority_queue.policies.bubble_placement import BubblePlacement
from tokenyard.services.priority_queue.policies.drr import DRR
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.policies.hybrid import hybrid, wfq
from tokenyard.services.priority_queue.policies.keeps_turn import KeepsTurn
from tokenyard.services.priority_queue.policies.lines import ShortestLine
from tokenyard.services.priority_queue.policies.strict import Strict

DEFAULT_POLICY = "hybrid"
"""The queue policy of `tokenyard queue` and `tokenyard sim` when none is named."""
POLICY_NAMES = ("fcfs", "strict", "drr", "wfq", "hybrid", "hybrid-wfq", "bubble", "bubble-placed", "fixed", "sjf")
KNOBS = ("aging_s", "bubble_width", "weights", "drr_quantum")


def make_policy(
    name: str,
    *,
    aging_s: Sequence[float] | None = AGING_S,
    bubble_width: float = 1024.0,
    weights: Sequence[float] = WFQ_WEIGHTS,
    drr_quantum: float = 256.0,
) -> QueuePolicy:
    """A fresh policy. `aging_s` = thresholds (P0, P1, P2, P3) in seconds (P0's is unused);
    None turns aging off."""
    if name == "fcfs":
        return FCFS()
    if name == "strict":
        inner: QueuePolicy = Strict()
    elif name == "drr":
        inner = DRR(base_quantum=drr_quantum)
    elif name == "wfq":
        inner = wfq(weights=weights)
    elif name == "hybrid":
        inner = hybrid(aging_s, weights=weights)
    elif name == "hybrid-wfq":
        inner = hybrid(aging_s, name="hybrid-wfq", weights=weights, fair_order="wfq")
    elif name == "bubble":
        inner = hybrid(aging_s, partial(BubbleLine, bubble_width, BASE_BOUNDS), name, weights)
    elif name == "bubble-placed":
        # round 5's turns (every range its turn each round): with the longer ranges yielding,
        # the placement's long p99 doubled on the held-out table (docs/results-bubble.md, round 9)
        line = partial(BubbleLine, bubble_width, BASE_BOUNDS, yields=False)
        inner = hybrid(aging_s, line, name, weights)
        return BubblePlacement(KeepsTurn(inner), ages_to=inner.ages_to)
    elif name == "fixed":
        inner = hybrid(aging_s, partial(BubbleLine, bubble_width, BASE_BOUNDS, False), "fixed", weights)
    elif name == "sjf":
        inner = hybrid(aging_s, ShortestLine, "sjf", weights)
    else:
        raise ValueError(f"unknown queue policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return KeepsTurn(inner)


def parse_aging(text: str) -> tuple[float, ...] | None:
    """`--aging 30,15,5` (P1,P2,P3 seconds) or `off`."""
    if text.strip().lower() in ("off", "none", ""):
        return None
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 3 or any(x <= 0 for x in parts):
        raise ValueError(f"--aging takes three positive seconds P1,P2,P3 or 'off', got {text!r}")
    return (float("inf"), *parts)
