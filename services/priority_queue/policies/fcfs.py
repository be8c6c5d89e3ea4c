"""First come, first served: dispatch in order of admission.

Order key = (arrival time at admission, request id): a request put back after the router
found no capacity re-enters with the same key, so it keeps its place at the head, and equal
times break deterministically. A heap with lazy deletion: push/pop O(log n), abort O(1).
"""

from __future__ import annotations

import heapq

from tokenyard.shared.schemas import AdmittedRequest


class FCFS:
    name = "fcfs"

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._items: dict[str, AdmittedRequest] = {}

    def push(self, req: AdmittedRequest, now: float) -> None:
        if req.request_id in self._items:
            return
        self._items[req.request_id] = req
        heapq.heappush(self._heap, (req.arrival_s, req.request_id))

    def pop(self, now: float) -> AdmittedRequest | None:
        while self._heap:
            _, rid = heapq.heappop(self._heap)
            req = self._items.pop(rid, None)
            if req is not None:
                return req
        return None

    def remove(self, request_id: str) -> AdmittedRequest | None:
        return self._items.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._items

    def __len__(self) -> int:
        return len(self._items)
