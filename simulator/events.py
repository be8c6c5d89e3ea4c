"""The virtual clock: a heap of timed events, ties broken by insertion order, so the same
inputs always replay in the same order (determinism needs no other rule).

    push(t, kind, data);  pop() → (t, kind, data), earliest first, FIFO among equal t
"""

from __future__ import annotations

import heapq
from typing import Any

STEP_DONE, TICK, DISPATCH, KV_ARRIVE, PROVISION = range(5)
"""Event kinds. Arrivals are not queued: the loop merges the sorted workload with the heap."""


class EventQueue:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, t: float, kind: int, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, data))

    def pop(self) -> tuple[float, int, Any]:
        t, _, kind, data = heapq.heappop(self._heap)
        return t, kind, data

    def peek_t(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def __len__(self) -> int:
        return len(self._heap)
