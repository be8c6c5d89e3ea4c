"""The ordering-policy port of the priority queue: every policy (FCFS, strict, DRR, WFQ,
hybrid, bubble queues and their baselines) implements these methods, and one conformance
suite (tests/test_queue_policies.py) runs against each.

Shared vocabulary of the class-aware policies (docs/ARCHITECTURE.md §3 and §5):
    cost(r)      = prompt_len + max_tokens            the work r asks for, in tokens
    deadline(r)  = shared.slo.request_deadline_s(r): the one admission stamped (class target +
                   own prefill, or the client's ttft_slo_ms), else arrival_s + TARGET_S[class];
                   in a line it has aged into, the earlier of that and the line's class target
    line key     = (deadline(r), arrival_s, request_id)   least deadline first within a class;
                   requests without deadlines of one class are then served in arrival order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import TTFT_TARGET_S, request_deadline_s, ttft_deadline_s

NUM_CLASSES = 4
WFQ_WEIGHTS: tuple[float, ...] = (16.0, 8.0, 4.0, 2.0)
"""P0..P3 weights of weighted fair queueing (seed 001 §3.3)."""
TARGET_S = TTFT_TARGET_S
"""The class SLO table (shared.slo); P3 has none (infinity), so its line stays FIFO."""
AGING_S: tuple[float, ...] = (float("inf"), 30.0, 15.0, 5.0)
"""Time in class P1, P2, P3 after which a waiting request moves up one class."""


Promotions = Sequence[tuple[int, float]]
"""Per class c: (the class a request ages into, after how long in c); (c, inf) where it stays.
A ClassScheduler's `ages_to`: the one aging rule, which a policy wrapping it applies too."""


def aged_class(cls: int, arrival_s: float, now: float, ages_to: Promotions) -> tuple[int, float]:
    """The class a request of class `cls` that arrived at `arrival_s` has aged into by `now`
    (each class's clock starting when the request was promoted into it, as in the scheduler),
    and when it is next promoted (inf: never)."""
    entered = arrival_s
    while True:
        to, limit = ages_to[cls]
        due = entered + limit
        if to == cls or due > now:
            return cls, due if to != cls else math.inf
        cls, entered = to, due


def cost(req: AdmittedRequest) -> int:
    return req.prompt_len + req.max_tokens


def klass(req: AdmittedRequest) -> int:
    return min(max(req.priority, 0), NUM_CLASSES - 1)


def deadline(req: AdmittedRequest, cls: int) -> float:
    due = request_deadline_s(req)
    if cls == klass(req):
        return due
    return min(due, ttft_deadline_s(req.arrival_s, cls, prefill_s=req.prefill_s))  # aged up a class


def line_key(req: AdmittedRequest, cls: int) -> tuple[float, float, str]:
    return (deadline(req, cls), req.arrival_s, req.request_id)


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


class RealtimePolicy(QueuePolicy, Protocol):
    """A class-aware policy: the queue may dispatch P0 from capacity reserved for it."""

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        """The next P0 request (after aging), removed; None when no P0 waits."""


class WorkerRoom(NamedTuple):
    """What a placing policy sees of one worker."""

    room: int
    """Prompt tokens the worker may still take (QueueCore's room_w; ≤ 0: saturated)."""
    backlog: int
    """Prompt tokens it has not prefilled yet (queued + routed since its heartbeat)."""


class PlacingPolicy(QueuePolicy, Protocol):
    """A policy that decides where its releases may go as well as when (bubble placement:
    length ranges that own instances). Under flow control the queue asks it instead of
    popping while the fleet-wide headroom lasts."""

    def release(self, rooms: Mapping[str, WorkerRoom], in_flight: Mapping[str, AdmittedRequest],
                size: Callable[[AdmittedRequest], int], now: float) -> list[tuple[AdmittedRequest, frozenset[str]]]:
        """The requests to release now, each with the workers it may go to; `rooms` maps each
        fresh worker that takes new requests to its WorkerRoom (room, backlog in tokens)."""
