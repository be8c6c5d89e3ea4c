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

The subscription lives on the first joiner's connection, so that service must be the last of
them to stop: `serve_together` stops services in the reverse order of their start, and the
first to start is the first to join. A service given no feed makes a Feed of its own and is
its only listener, as before.
"""

from __future__ import annotations

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

    async def join(self, nc: Client, listener: Listener[T]) -> None:
        """Add `listener`; the first call subscribes on `nc`."""
        self.listeners.append(listener)
        if self.subscription is None:
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
