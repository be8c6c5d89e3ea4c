"""Class-level scheduling with aging: the hybrid policy of seed 001 (DESIGN §3.3), and WFQ.

Classes are split into three tiers, tried in order on every pop:
  strict   (hybrid: P0)      the first non-empty class wins, never waits behind others;
  fair     (hybrid: P1, P2)  weighted fair queueing by virtual finish time, tagging the head
                             of each backlogged class c:
                                 F_c = max(V, F_last[c]) + cost(head_c) / w_c
                             a head's tag is fixed when it becomes the head; the class with
                             the least F_c (ties: lower class) is served, then V ← F_c,
                             F_last[c] ← F_c (self-clocked: a class that was idle re-enters
                             at V, banking no credit); w = 16/8/4/2 for P0..P3;
  best effort (hybrid: P3)   only when nothing in the tiers above waits.
`wfq` is the same machine with all four classes in the fair tier.

Deadline-first fair tier (`fair_order="deadline"`, hybrid's default). Under flow control the
backlog waits here, so whom the fair tier serves first decides who misses a deadline. WFQ
serves P2 its share (4 of 12) even while P2's head has a minute of slack and P1's head is
about to pass its 5 s target: on saturated chatbot that cost 248 P1 requests (65 refused, 158
expired, 25 late; docs/results-priorities.md §1.1). So the fair tier serves the head that
must leave first, WFQ only ordering what deadlines leave open:

    release_c = shared.slo.latest_release_s(deadline(head_c, c), prefill(head_c))
    key_c     = (0, release_c, F_c, c)   if now ≤ release_c < ∞   (it can still make it)
              = (1, F_c, c)              otherwise                 (no deadline, or missed)
    serve the class with the least key_c; V and F_last advance as in WFQ.

A head that can still meet its deadline goes before any that cannot, earliest release first
(EDF, which on one server meets every set of deadlines any order could); the rest share by
WFQ tags, so a head that has already missed (the queue's expiry is off, or has not run yet)
gets no priority over the ones it would make late — EDF's domino — and heads without
deadlines keep their weighted shares. A class is not starved: its head is served by its
release time unless heads with earlier releases fill the fleet until then, and once it has
missed it competes by WFQ tag.

Aging: a request that has spent AGING_S[c] in class c (P3 5 s, P2 15 s, P1 30 s) moves to
c − 1, its clock in the new class starting when it was promoted (so a long-idle queue
promotes exactly as a continuously polled one would). With the deadline-first fair tier a
request does not age from one fair class into another (its deadline already orders it); it
leaves the tier after the thresholds it skips (hybrid: P2 → P0 after 15 + 30 s). Within a
class, a line orders the requests (least deadline first by default; bubble / SJF lines in
bubble.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from tokenyard.services.priority_queue.policies.base import (
    AGING_S,
    NUM_CLASSES,
    WFQ_WEIGHTS,
    cost,
    deadline,
    klass,
)
from tokenyard.services.priority_queue.policies.lines import DeadlineLine, Line
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import latest_release_s

FAIR_ORDERS = ("deadline", "wfq")


class ClassScheduler:
    def __init__(
        self,
        name: str,
        strict: Sequence[int] = (0,),
        fair: Sequence[int] = (1, 2),
        best_effort: Sequence[int] = (3,),
        weights: Sequence[float] = WFQ_WEIGHTS,
        aging_s: Sequence[float] | None = AGING_S,
        line: Callable[[], Line] = DeadlineLine,
        fair_order: str = "wfq",
    ) -> None:
        assert sorted([*strict, *fair, *best_effort]) == list(range(NUM_CLASSES))
        assert fair_order in FAIR_ORDERS, fair_order
        self.name = name
        self.fair_order = fair_order
        self.strict, self.fair, self.best_effort = tuple(strict), tuple(fair), tuple(best_effort)
        self.weights = tuple(weights)
        self.aging_s = tuple(aging_s) if aging_s is not None else (float("inf"),) * NUM_CLASSES
        self._ages_to: list[tuple[int, float]] = [self._promotion(c) for c in range(NUM_CLASSES)]
        """Per class: (the class a request ages into, after how long in this one)."""
        self.lines: list[Line] = [line() for _ in range(NUM_CLASSES)]
        self._where: dict[str, tuple[int, float]] = {}
        """request id → (current class, time it entered that class)."""
        self._age: list[list[tuple[float, str]]] = [[] for _ in range(NUM_CLASSES)]
        """Per class: (entered, id) heaps with lazy deletion, to find who is due to age."""
        self.virtual = 0.0
        self.last_finish = [0.0] * NUM_CLASSES
        self._head_tag: list[tuple[str, float] | None] = [None] * NUM_CLASSES
        self.promotions = 0

    # ── port ──
    def push(self, req: AdmittedRequest, now: float) -> None:
        if req.request_id in self._where:
            return
        self._enter(req, klass(req), req.arrival_s)

    def pop(self, now: float) -> AdmittedRequest | None:
        self.age_until(now)
        for c in self.strict:
            if len(self.lines[c]):
                return self._take(c)
        c = self._fair_pick(now)
        if c is not None:
            self.virtual = self.last_finish[c] = self._tag(c)
            self._head_tag[c] = None
            return self._take(c)
        for c in self.best_effort:
            if len(self.lines[c]):
                return self._take(c)
        return None

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        self.age_until(now)
        return self._take(0) if len(self.lines[0]) else None

    def remove(self, request_id: str) -> AdmittedRequest | None:
        where = self._where.pop(request_id, None)
        return None if where is None else self.lines[where[0]].remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    @property
    def ages_to(self) -> list[tuple[int, float]]:
        """Per class: (the class a request ages into, after how long in this one)."""
        return list(self._ages_to)

    def class_of(self, request_id: str) -> int | None:
        where = self._where.get(request_id)
        return None if where is None else where[0]

    # ── internals ──
    def _enter(self, req: AdmittedRequest, c: int, entered: float) -> None:
        self._where[req.request_id] = (c, entered)
        self.lines[c].push(req, c)
        if c > 0 and self._ages_to[c][1] != float("inf"):
            heapq.heappush(self._age[c], (entered, req.request_id))

    def _take(self, c: int) -> AdmittedRequest:
        req = self.lines[c].pop()
        assert req is not None
        del self._where[req.request_id]
        return req

    def _promotion(self, c: int) -> tuple[int, float]:
        """Aging moves a class-c request to c − 1 after aging_s[c]. A deadline-first fair tier
        already serves a request by its deadline, and a request aged into another fair class
        would carry that class's (long passed) target into its line, ahead of requests that can
        still make theirs: there a fair request climbs straight out of the tier, after the
        thresholds it skips (hybrid: P2 → P0 after 15 + 30 s), as it would have reached it."""
        to, limit = c - 1, self.aging_s[c]
        if self.fair_order == "deadline" and c in self.fair:
            while to in self.fair:
                limit += self.aging_s[to]
                to -= 1
        return (to, limit) if to >= 0 else (c, float("inf"))  # no tier above: it stays

    def age_until(self, now: float) -> None:
        """The policy's aging step (public: push and pop run it, and tests drive it): promote every
        request that has spent its class's threshold by `now`, as often as it is due."""
        for line in self.lines:  # the lines' clock too (bubble.py: when a range is overdue)
            line.at(now)
        # Lower classes first, so a request may climb several classes in one call.
        for c in range(NUM_CLASSES - 1, 0, -1):
            to, limit = self._ages_to[c]
            heap = self._age[c]
            while heap and heap[0][0] + limit <= now:
                entered, rid = heapq.heappop(heap)
                if self._where.get(rid) != (c, entered):
                    continue  # stale: served, removed or already promoted
                req = self.lines[c].remove(rid)
                assert req is not None
                self.promotions += 1
                self._enter(req, to, entered + limit)

    def _tag(self, c: int) -> float:
        head = self.lines[c].peek()
        assert head is not None
        known = self._head_tag[c]
        if known is not None and known[0] == head.request_id:
            return known[1]
        tag = max(self.virtual, self.last_finish[c]) + cost(head) / self.weights[c]
        self._head_tag[c] = (head.request_id, tag)
        return tag

    def _release(self, c: int) -> float:
        """The latest time class c's head may leave and still meet its deadline (∞: none)."""
        head = self.lines[c].peek()
        assert head is not None
        return latest_release_s(deadline(head, c), head.prefill_s)

    def _fair_pick(self, now: float) -> int | None:
        best: tuple | None = None
        for c in self.fair:
            if len(self.lines[c]):
                cand: tuple = (self._tag(c), c)
                if self.fair_order == "deadline":
                    release = self._release(c)
                    cand = (0, release, *cand) if now <= release < math.inf else (1, *cand)
                if best is None or cand < best:
                    best = cand
        return None if best is None else best[-1]


def hybrid(aging_s: Sequence[float] | None = AGING_S, line: Callable[[], Line] = DeadlineLine,
           name: str = "hybrid", weights: Sequence[float] = WFQ_WEIGHTS,
           fair_order: str = "deadline") -> ClassScheduler:
    """P0 strict · P1–P2 fair (deadline-first by default; `fair_order="wfq"`: DESIGN §3.3's
    plain WFQ, the policy `hybrid-wfq`) · P3 best effort · aging."""
    return ClassScheduler(name, (0,), (1, 2), (3,), weights, aging_s, line, fair_order)


def wfq(aging_s: Sequence[float] | None = None, weights: Sequence[float] = WFQ_WEIGHTS) -> ClassScheduler:
    return ClassScheduler("wfq", (), (0, 1, 2, 3), (), weights, aging_s, DeadlineLine)
