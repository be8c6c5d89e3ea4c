"""One subscription per process for a fan-out subject, handed to every service in the process
that listens to it.

`tokenyard queue --with-router --with-admission` runs three services in one process, each on
its own NATS connection. Each used to subscribe to `llm.v1.hb.*` itself: nats-server sent
every heartbeat to the process three times, and the process read, parsed and decoded it three
times (4 workers × 10 beats a second × 3: a third of the idle fleet's CPU in that process,
bench/idle_cpu.py). A Feed is one subscription whose message is decoded once and handed,
with one clock reading, to each listener in the order they joined:

    feed = Feed(subjects.HEARTBEAT_ALL, schemas.Heartbeat)
    await feed.join(router_nc, router.on_heartbeat)   # the first to join subscribes, on its connection
    await feed.join(queue_nc, queue.on_heartbeat)     # the others only listen

The subscription lives on the first joiner's connection. A service that stops leaves
(`leave`, in its shell's stop): should the subscription live on its connection, it moves to
the connection of the earliest joiner still listening (none left: it is gone). A service
that joins again (stopped and started on a new connection) is one listener, not two; a feed
whose connection was closed without a leave subscribes again on the next joiner's.
`serve_together` stops services in the reverse order of their start, so the first joiner
usually leaves last. A service given no feed makes a Feed of its own and is its only
listener, as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from tokenyard.shared import codec, schemas, subjects, telemetry

log = telemetry.logger("feed")

T = TypeVar("T")
Listener = Callable[[T, float], None]
"""Called with the decoded message and `time.time()` at its arrival; synchronous: a listener
that must publish starts a task."""


class Feed(Generic[T]):
    def __init__(self, subject: str, type_: type[T]):
        self.subject = subject
        self.type = type_
        self.listeners: list[Listener[T]] = []
        self.subscription: Subscription | None = None
        self.nc: Client | None = None
        """The connection the subscription lives on (the first joiner's)."""
        self.bad = 0
        """Messages that did not decode (each logged)."""
        self.joined: dict[Listener[T], Client] = {}
        """Each listener's own connection (where the subscription goes should its holder leave)."""

    async def join(self, nc: Client, listener: Listener[T]) -> None:
        """Add `listener` (once: a listener that joins again only moves to `nc`); the first call
        subscribes on `nc`, and so does any call while the subscription's connection is closed."""
        if listener not in self.joined:
            self.listeners.append(listener)
        self.joined[listener] = nc
        if self.subscription is None or self.nc is None or self.nc.is_closed:
            await self._subscribe(nc)

    async def leave(self, listener: Listener[T]) -> None:
        """Remove `listener` (a stopping service's); the subscription, if it lives on that
        listener's connection, moves to the earliest remaining joiner's (none: it ends)."""
        nc = self.joined.pop(listener, None)
        with contextlib.suppress(ValueError):
            self.listeners.remove(listener)
        if nc is None or nc is not self.nc or nc in self.joined.values():  # another joiner's connection too: stays
            return
        old, self.subscription, self.nc = self.subscription, None, None
        if old is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        for other in list(self.joined.values()):
            if other.is_closed:
                continue
            try:  # a connection draining now refuses it: try the next (a stopping service must stop)
                await self._subscribe(other)
                return
            except Exception:
                self.nc = self.subscription = None

    async def _subscribe(self, nc: Client) -> None:
        self.nc = nc
        self.subscription = await nc.subscribe(self.subject, cb=self._on_msg)

    @property
    def connected(self) -> bool:
        """Whether the feed can hear anything now: its connection (another service's, perhaps)
        is up. A listener that judges silence (admission's liveness) checks it."""
        return self.nc is not None and self.nc.is_connected

    async def _on_msg(self, msg: Msg) -> None:
        try:
            value = codec.decode(msg.data, self.type)
        except codec.DecodeError as e:
            self.bad += 1
            log.warning("bad_message", subject=msg.subject, error=str(e))
            return
        self.deliver(value, time.time())

    def deliver(self, value: T, now: float) -> None:
        """Hand one message to every listener; one that raises does not keep it from the rest."""
        for listener in self.listeners:
            try:
                listener(value, now)
            except Exception:
                log.exception("listener_failed", subject=self.subject, listener=getattr(listener, "__qualname__", "?"))


@dataclass
class ProcessFeeds:
    """The fan-out subjects that several services of one process listen to."""

    heartbeats: Feed[schemas.Heartbeat] = field(
        default_factory=lambda: Feed(subjects.HEARTBEAT_ALL, schemas.Heartbeat))
    """Every worker's heartbeat (`llm.v1.hb.*`): admission, the queue and the router."""
    queue_states: Feed[schemas.QueueStats] = field(
        default_factory=lambda: Feed(subjects.QUEUE_STATE, schemas.QueueStats))
    """Every queue's QueueStats (`llm.v1.pq.state`): admission and the queue (its peers)."""
