"""Strict priority: always the highest non-empty class (seed 001 §3.1).

Order key = (class, deadline, arrival, id): P0 before P1 before …, least deadline first
within a class. No aging, by design: under a sustained P0 load P1–P3 wait for ever (the
seed's "fatal flaw"); it is here as the baseline the other policies are judged against.
"""

from __future__ import annotations

from tokenyard.services.priority_queue.policies.base import klass, line_key
from tokenyard.services.priority_queue.policies.lines import HeapLine
from tokenyard.shared.schemas import AdmittedRequest


class _ClassFirst(HeapLine):
    def key(self, req: AdmittedRequest, cls: int) -> tuple:
        return (cls, *line_key(req, cls))


class Strict:
    name = "strict"

    def __init__(self) -> None:
        self._line = _ClassFirst()

    def push(self, req: AdmittedRequest, now: float) -> None:
        if req.request_id not in self._line._items:
            self._line.push(req, klass(req))

    def pop(self, now: float) -> AdmittedRequest | None:
        return self._line.pop()

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        head = self._line.peek()
        return self._line.pop() if head is not None and klass(head) == 0 else None

    def remove(self, request_id: str) -> AdmittedRequest | None:
        return self._line.remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._line._items

    def __len__(self) -> int:
        return len(self._line)
