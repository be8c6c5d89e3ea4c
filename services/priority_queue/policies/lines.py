"""Lines: the order of requests *within* one class, under a class-level policy.

    DeadlineLine   least deadline first: key = (deadline, arrival, id)       (SCORPIO's LDF)
    ShortestLine   shortest job first:   key = (cost, deadline, arrival, id) (SJF baseline)
    BubbleLine     length partitions, each served in its turn (bubble.py)

A line is a heap with lazy deletion: push / pop O(log n), remove O(1). A request's key is
computed on push with the class it is pushed into (aging re-pushes it one class up).
"""

from __future__ import annotations

import heapq
from typing import Protocol

from tokenyard.services.priority_queue.policies.base import cost, line_key
from tokenyard.shared.schemas import AdmittedRequest


class Line(Protocol):
    def at(self, now: float) -> None:
        """The time of the pop that follows (a line whose order depends on waiting time)."""

    def push(self, req: AdmittedRequest, cls: int) -> None: ...

    def pop(self) -> AdmittedRequest | None: ...

    def peek(self) -> AdmittedRequest | None: ...

    def remove(self, request_id: str) -> AdmittedRequest | None: ...

    def __len__(self) -> int: ...


class HeapLine:
    """A keyed heap; subclasses choose the key."""

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._items: dict[str, AdmittedRequest] = {}

    def at(self, now: float) -> None:
        pass

    def key(self, req: AdmittedRequest, cls: int) -> tuple:
        raise NotImplementedError

    def push(self, req: AdmittedRequest, cls: int) -> None:
        self._items[req.request_id] = req
        heapq.heappush(self._heap, (*self.key(req, cls), id(req)))

    def _clean(self) -> None:
        # A heap entry is live iff its request is still here *as that object* (an entry left
        # by a removed-then-re-pushed request is stale: the id matches, the object may not).
        while self._heap:
            top = self._heap[0]
            req = self._items.get(top[-2])
            if req is not None and id(req) == top[-1]:
                return
            heapq.heappop(self._heap)

    def peek(self) -> AdmittedRequest | None:
        self._clean()
        return self._items[self._heap[0][-2]] if self._heap else None

    def pop(self) -> AdmittedRequest | None:
        self._clean()
        if not self._heap:
            return None
        top = heapq.heappop(self._heap)
        return self._items.pop(top[-2])

    def remove(self, request_id: str) -> AdmittedRequest | None:
        return self._items.pop(request_id, None)

    def requests(self) -> list[AdmittedRequest]:
        """The waiting requests, in no particular order (a copy: safe to remove while iterating)."""
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


class DeadlineLine(HeapLine):
    def key(self, req: AdmittedRequest, cls: int) -> tuple:
        return line_key(req, cls)


class ShortestLine(HeapLine):
    def key(self, req: AdmittedRequest, cls: int) -> tuple:
        return (cost(req), *line_key(req, cls))
