"""The ordering-policy port of the priority queue: every policy (FCFS now; strict/WFQ/aging,
bubble queues in issue 7) implements these methods, and one conformance suite
(tests/test_queue_policies.py) runs against each."""

from __future__ import annotations

from typing import Protocol

from shared.schemas import AdmittedRequest


class QueuePolicy(Protocol):
    name: str

    def push(self, req: AdmittedRequest, now: float) -> None:
        """Add a request (or put back one the router could not place: it keeps its turn)."""

    def pop(self, now: float) -> AdmittedRequest | None:
        """The next request to dispatch, removed; None when empty."""

    def remove(self, request_id: str) -> AdmittedRequest | None:
        """Take a waiting request out (abort); None if it is not here."""

    def __contains__(self, request_id: str) -> bool: ...

    def __len__(self) -> int: ...
