"""One stream's mailbox on a client's shared subscription (shared/client.py): the messages
nats-py's reader hands over for that stream, and the stream's waiting for them — a future per
wait, made only when nothing is pending (a burst is read in one wake-up), and one lazy timer.
"""

from __future__ import annotations

import asyncio
import collections
import math


def _ring(waiter: asyncio.Future | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class Inbox:
    """The lazy timer is moved earlier when a wait needs it and otherwise left to fire (at most
    once a second: the stream's checks run then), never rescheduled per message."""

    __slots__ = ("request_id", "msgs", "waiter", "timer", "wake_at", "closed")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.msgs: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.wake_at = math.inf
        self.closed = False
        """Its client was closed: the stream ends at its next wake-up."""

    def put(self, msg) -> None:
        self.msgs.append(msg)
        _ring(self.waiter)

    def end(self) -> None:
        self.closed = True
        _ring(self.waiter)

    async def wait(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        """Return once a message is pending or the stream is ended, or at `until` (the loop's
        clock) at the latest (possibly sooner: a timer set for an earlier wait wakes this one;
        the caller rechecks)."""
        if self.msgs or self.closed:
            return
        if self.timer is None or self.wake_at > until:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.wake_at = loop.call_at(until, self._fire), until
        self.waiter = loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def _fire(self) -> None:
        self.timer, self.wake_at = None, math.inf
        _ring(self.waiter)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
