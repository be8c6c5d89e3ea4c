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

Aging: a request that has spent AGING_S[c] in class c (P3 5 s, P2 15 s, P1 30 s) moves to
c − 1, its clock in the new class starting when it was promoted (so a long-idle queue
promotes exactly as a continuously polled one would). Within a class, a line orders the
requests (least deadline first by default; bubble / SJF lines in bubble.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from tokenyard.services.priority_queue.policies.base import AGING_S, NUM_CLASSES, WFQ_WEIGHTS, cost, klass
from tokenyard.services.priority_queue.policies.lines import DeadlineLine, Line
from tokenyard.shared.schemas import AdmittedRequest


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
    ) -> None:
        assert sorted([*strict, *fair, *best_effort]) == list(range(NUM_CLASSES))
        self.name = name
        self.strict, self.fair, self.best_effort = tuple(strict), tuple(fair), tuple(best_effort)
        self.weights = tuple(weights)
        self.aging_s = tuple(aging_s) if aging_s is not None else (float("inf"),) * NUM_CLASSES
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
        self._age_until(now)
        for c in self.strict:
            if len(self.lines[c]):
                return self._take(c)
        c = self._fair_pick()
        if c is not None:
            self.virtual = self.last_finish[c] = self._tag(c)
            self._head_tag[c] = None
            return self._take(c)
        for c in self.best_effort:
            if len(self.lines[c]):
                return self._take(c)
        return None

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        self._age_until(now)
        return self._take(0) if len(self.lines[0]) else None

    def remove(self, request_id: str) -> AdmittedRequest | None:
        where = self._where.pop(request_id, None)
        return None if where is None else self.lines[where[0]].remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def class_of(self, request_id: str) -> int | None:
        where = self._where.get(request_id)
        return None if where is None else where[0]

    # ── internals ──
    def _enter(self, req: AdmittedRequest, c: int, entered: float) -> None:
        self._where[req.request_id] = (c, entered)
        self.lines[c].push(req, c)
        if self.aging_s[c] != float("inf"):
            heapq.heappush(self._age[c], (entered, req.request_id))

    def _take(self, c: int) -> AdmittedRequest:
        req = self.lines[c].pop()
        assert req is not None
        del self._where[req.request_id]
        return req

    def _age_until(self, now: float) -> None:
        # Lower classes first, so a request may climb several classes in one call.
        for c in range(NUM_CLASSES - 1, 0, -1):
            limit = self.aging_s[c]
            heap = self._age[c]
            while heap and heap[0][0] + limit <= now:
                entered, rid = heapq.heappop(heap)
                if self._where.get(rid) != (c, entered):
                    continue  # stale: served, removed or already promoted
                req = self.lines[c].remove(rid)
                assert req is not None
                self.promotions += 1
                self._enter(req, c - 1, entered + limit)

    def _tag(self, c: int) -> float:
        head = self.lines[c].peek()
        assert head is not None
        known = self._head_tag[c]
        if known is not None and known[0] == head.request_id:
            return known[1]
        tag = max(self.virtual, self.last_finish[c]) + cost(head) / self.weights[c]
        self._head_tag[c] = (head.request_id, tag)
        return tag

    def _fair_pick(self) -> int | None:
        best: tuple[float, int] | None = None
        for c in self.fair:
            if len(self.lines[c]):
                cand = (self._tag(c), c)
                if best is None or cand < best:
                    best = cand
        return None if best is None else best[1]


def hybrid(aging_s: Sequence[float] | None = AGING_S, line: Callable[[], Line] = DeadlineLine,
           name: str = "hybrid", weights: Sequence[float] = WFQ_WEIGHTS) -> ClassScheduler:
    return ClassScheduler(name, (0,), (1, 2), (3,), weights, aging_s, line)


def wfq(aging_s: Sequence[float] | None = None, weights: Sequence[float] = WFQ_WEIGHTS) -> ClassScheduler:
    return ClassScheduler("wfq", (), (0, 1, 2, 3), (), weights, aging_s, DeadlineLine)
