"""Deficit round robin over the classes, priced in tokens (Shreedhar & Varghese; seed 001 §3.2
made cost-aware, the flaw the seed points out in its per-request version).

Classes are visited in the order P0, P1, P2, P3, P0, …; on arriving at a backlogged class c
its deficit grows by quantum_c = weight_c × base_quantum (weights 8/4/2/1), and c is served
while deficit_c ≥ cost(head_c) (cost = prompt + max_tokens), paying the cost each time; then
the round moves on. A class found empty forfeits its deficit. A pop that would need k
fruitless rounds (heads costlier than k quanta) adds the k rounds' quanta at once, so a pop
is O(classes), whatever the costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tokenyard.services.priority_queue.policies.base import NUM_CLASSES, cost, klass
from tokenyard.services.priority_queue.policies.lines import DeadlineLine
from tokenyard.shared.schemas import AdmittedRequest

DRR_WEIGHTS: tuple[float, ...] = (8.0, 4.0, 2.0, 1.0)


class DRR:
    name = "drr"

    def __init__(self, base_quantum: float = 256.0, weights: Sequence[float] = DRR_WEIGHTS) -> None:
        self.quantum = [w * base_quantum for w in weights]
        self.lines = [DeadlineLine() for _ in range(NUM_CLASSES)]
        self.deficit = [0.0] * NUM_CLASSES
        self.cursor = 0
        self.fresh = True
        """The cursor just arrived at its class: the quantum has not been granted yet."""
        self._class: dict[str, int] = {}

    def push(self, req: AdmittedRequest, now: float) -> None:
        if req.request_id in self._class:
            return
        c = klass(req)
        self._class[req.request_id] = c
        self.lines[c].push(req, c)

    def pop(self, now: float) -> AdmittedRequest | None:
        if not self._class:
            return None
        for _ in range(2 * NUM_CLASSES + 1):
            c = self.cursor
            line = self.lines[c]
            head = line.peek()
            if head is None:
                self.deficit[c] = 0.0
            else:
                if self.fresh:
                    self.deficit[c] += self.quantum[c]
                    self.fresh = False
                if self.deficit[c] >= cost(head):
                    self.deficit[c] -= cost(head)
                    return self._take(c)
            self._advance()
            if self.cursor == 0:
                self._skip_fruitless_rounds()
        raise AssertionError("DRR found no request to serve")  # pragma: no cover

    def _skip_fruitless_rounds(self) -> None:
        """Grant, at once, the rounds after which the first head becomes affordable."""
        rounds = min(
            math.ceil((cost(h) - self.deficit[c]) / self.quantum[c])
            for c in range(NUM_CLASSES)
            if (h := self.lines[c].peek()) is not None
        )
        if rounds > 1:
            for c in range(NUM_CLASSES):
                if len(self.lines[c]):
                    self.deficit[c] += (rounds - 1) * self.quantum[c]

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        return self._take(0) if len(self.lines[0]) else None

    def _take(self, c: int) -> AdmittedRequest:
        req = self.lines[c].pop()
        assert req is not None
        del self._class[req.request_id]
        return req

    def _advance(self) -> None:
        self.cursor = (self.cursor + 1) % NUM_CLASSES
        self.fresh = True

    def remove(self, request_id: str) -> AdmittedRequest | None:
        c = self._class.pop(request_id, None)
        return None if c is None else self.lines[c].remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._class

    def __len__(self) -> int:
        return len(self._class)
