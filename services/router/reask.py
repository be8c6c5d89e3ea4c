"""The router's re-ask memory, pure: a route request is idempotent per request.

A queue asks again when the answer to its first ask was lost (a timeout: the request may be
on a worker), and JetStream redelivers what a dead queue held. A request is the same request
when its key is: (request id, reply subject, kv_from) — a P/D decode leg is placed on its own.

    ask(key, waiter, moved_to) → Answer | Wait | Place
        Answer(decision)   routed before: `routed` to the same worker again (or where
                           migration has moved it since, `moved_to`), reason REOFFERED; no
                           second offer (another worker would take it: two generations on
                           one stream)
        Wait               a placement of this key is under way: `waiter` is kept and handed
                           back by `settle`, with that placement's decision
        Place              nobody places it: the caller does, and calls `settle` at the end
    first_offer(key) → worker | None
                           the worker whose offer of this request went unanswered last time:
                           offered it first (it answers REOFFERED if it took it)
    unsure(key, worker) → RouteDecision(no_capacity, unsure=True)
                           an offer went unanswered: remembered for `first_offer`
    settle(key, decision) → [waiter]
                           the placement ended: a `routed` decision is remembered; the
                           waiters that joined it get the same decision

`placed` and `unanswered` are bounded (the last `capacity` keys, oldest forgotten first): a
queue's re-ask comes seconds later, a dead queue's redelivery after its ack_wait (30 s), and
a worker remembers as many ids. Waiters are the caller's (futures in the shell); the core
only keeps them and hands them back, so a test drives it with plain objects.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from tokenyard.shared import schemas

PLACED_REMEMBERED = 50_000
"""Routed requests (and unanswered offers) remembered for a repeated ask (as many as a worker
remembers ids)."""

Key = tuple[str, str, str]
"""(request id, reply subject, kv_from)."""
W = TypeVar("W")


def key_of(ar: schemas.AdmittedRequest) -> Key:
    return (ar.request_id, ar.reply_to, ar.kv_from)


@dataclass(frozen=True)
class Answer:
    """Routed before: answer this, offer nothing."""

    decision: schemas.RouteDecision


@dataclass(frozen=True)
class Wait:
    """A placement of the same request is under way; its `settle` hands the waiter back."""


@dataclass(frozen=True)
class Place:
    """Place the request (then `settle` it)."""


Ask = Answer | Wait | Place


class ReaskMemory(Generic[W]):
    def __init__(self, capacity: int = PLACED_REMEMBERED):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.placing: dict[Key, list[W]] = {}
        """key → the waiters of its placement under way (asks that came meanwhile)."""
        self.placed: OrderedDict[Key, str] = OrderedDict()
        """key → the worker it was routed to (the last `capacity`)."""
        self.unanswered: OrderedDict[Key, str] = OrderedDict()
        """key → the worker that left its offer unanswered (the last `capacity`)."""

    def ask(self, key: Key, waiter: W, moved_to: str | None = None) -> Ask:
        """A route request for `key`. `moved_to`: where migration follows the request now
        ('' or None: nowhere else than where it was placed)."""
        worker = self.placed.get(key)
        if worker is not None:
            return Answer(schemas.RouteDecision(key[0], schemas.Outcome.ROUTED, moved_to or worker,
                                                reason=schemas.REOFFERED))
        waiters = self.placing.get(key)
        if waiters is not None:
            waiters.append(waiter)
            return Wait()
        self.placing[key] = []
        return Place()

    def first_offer(self, key: Key) -> str | None:
        """The worker that left this request's last offer unanswered (forgotten once asked)."""
        return self.unanswered.pop(key, None)

    def unsure(self, key: Key, worker_id: str) -> schemas.RouteDecision:
        """`worker_id` left the offer unanswered: it may hold the request. The queue asks again,
        and that ask offers it to `worker_id` first."""
        self._remember(self.unanswered, key, worker_id)
        return schemas.RouteDecision(key[0], schemas.Outcome.NO_CAPACITY, reason=f"no answer from {worker_id}",
                                     unsure=True)

    def settle(self, key: Key, decision: schemas.RouteDecision | None) -> list[W]:
        """The placement of `key` ended with `decision` (None: it failed, nothing to remember).
        Returns the waiters that joined it: they get the same decision."""
        waiters = self.placing.pop(key, [])
        if decision is not None and decision.outcome == schemas.Outcome.ROUTED:
            self._remember(self.placed, key, decision.worker_id)
        return waiters

    def _remember(self, memory: OrderedDict[Key, str], key: Key, worker_id: str) -> None:
        memory[key] = worker_id
        memory.move_to_end(key)
        while len(memory) > self.capacity:
            memory.popitem(last=False)
