"""The virtual clock: timed events, ties broken by insertion order, so the same inputs
always replay in the same order (determinism needs no other rule).

    push(t, kind, data);  pop() → (t, kind, data), earliest first, FIFO among equal t
    next_look_t()         the earliest event that is not an engine's STEP_DONE

Engine steps and everything else live in two heaps that share one insertion counter, so
`pop` gives the order one heap would; the second heap answers `next_look_t` at once: until
then, no event looks at an instance's engine except that instance's own steps (the
simulator folds an engine's decode steps up to there, fold.py).
"""

from __future__ import annotations

import heapq
from typing import Any

STEP_DONE, TICK, DISPATCH, KV_ARRIVE, PROVISION = range(5)
"""Event kinds. Arrivals are not queued: the loop merges the sorted workload with the heap."""

_INF = float("inf")


class EventQueue:
    __slots__ = ("_steps", "_other", "_seq")

    def __init__(self) -> None:
        self._steps: list[tuple[float, int, int, Any]] = []
        self._other: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, t: float, kind: int, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._steps if kind == STEP_DONE else self._other, (t, self._seq, kind, data))

    def pop(self) -> tuple[float, int, Any]:
        steps, other = self._steps, self._other
        if steps and (not other or steps[0][:2] < other[0][:2]):
            t, _, kind, data = heapq.heappop(steps)
        else:
            t, _, kind, data = heapq.heappop(other)
        return t, kind, data

    def peek_t(self) -> float:
        steps, other = self._steps, self._other
        if steps:
            return min(steps[0][0], other[0][0]) if other else steps[0][0]
        return other[0][0] if other else _INF

    def next_look_t(self) -> float:
        """When the next event other than a STEP_DONE happens (inf: none is queued)."""
        return self._other[0][0] if self._other else _INF

    def only_tick(self) -> bool:
        """The one event queued other than STEP_DONEs is a TICK (no DISPATCH, KV_ARRIVE, PROVISION)."""
        other = self._other
        return len(other) == 1 and other[0][2] == TICK

    def only_steps(self) -> bool:
        """No event is queued but STEP_DONEs."""
        return not self._other

    def __len__(self) -> int:
        return len(self._steps) + len(self._other)
