"""How a router follows the streams it placed (migration reads every event of each, to resume
a stream elsewhere if its worker dies):

    await follows.follow(request_id, reply_subject, seen)   seen(msg) → True at the stream's end
    await follows.unfollow(request_id)

A stream whose reply subject is an inbox of a client in this process — the HTTP edge beside
the router in the queue's process, `tokenyard up`'s layout — is followed there: a tap on that
client's shared inbox subscription (TokenyardClient.tap) hands the router each event as the
client receives it, read on the loop's next turn, after the client's own reader (whose wake-up
is queued first): the edge writes a first token before the router's bookkeeping runs. The
router then holds no subscription of its own on the subject: no SUB before the offer and no
UNSUB after the end, and nats-server delivers each event into this process once instead of
twice. Any other stream (a NATS client's, another process's edge) is subscribed to on the
router's connection, as before. Either way `seen` gets the same messages: those that reach
the subject over NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from tokenyard.shared import telemetry

log = telemetry.logger("router")


class StreamTaps(Protocol):
    """A client in this process whose stream inboxes can be read beside it (TokenyardClient)."""

    def tap(self, subject: str, reader: Callable[[Any], None]) -> bool: ...

    def untap(self, subject: str) -> None: ...


class Follows:
    """request id → how its stream is followed: a tapped subject, or a subscription."""

    def __init__(self) -> None:
        self.nc: Client | None = None
        self.local: Callable[[], StreamTaps | None] = lambda: None
        """The client in this process whose streams can be tapped (None: none, or not started)."""
        self._by_id: dict[str, Subscription | str] = {}
        self._pending: list[tuple[Callable[[Any], None], Any]] = []
        """Tapped messages not yet read (`_later`)."""

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def tapped(self, request_id: str) -> bool:
        """Followed through a tap on a client in this process, not a subscription of its own."""
        return isinstance(self._by_id.get(request_id), str)

    async def follow(self, request_id: str, subject: str, seen: Callable[[Any], bool]) -> None:
        """Hand `seen` every message to `subject` until it answers True (the stream's end) or
        `unfollow`; a request followed already, or without a subject, is left as it is."""
        if request_id in self._by_id or not subject:
            return
        taps = self.local()
        if taps is not None:
            def read(msg) -> None:
                if seen(msg) and self._by_id.get(request_id) == subject:
                    del self._by_id[request_id]
                    taps.untap(subject)

            if taps.tap(subject, functools.partial(self._later, read)):
                self._by_id[request_id] = subject
                return

        async def read_sub(msg) -> None:
            if seen(msg):
                await self.unfollow(request_id)

        assert self.nc is not None
        self._by_id[request_id] = await self.nc.subscribe(subject, cb=read_sub)

    def _later(self, read: Callable[[Any], None], msg) -> None:
        """A tapped message is read on the loop's next turn, after the client's own reader (whose
        wake-up is already queued): the edge writes the first token before the router's bookkeeping."""
        self._pending.append((read, msg))
        if len(self._pending) == 1:
            asyncio.get_running_loop().call_soon(self._read_pending)

    def _read_pending(self) -> None:
        pending, self._pending = self._pending, []
        for read, msg in pending:
            try:
                read(msg)
            except Exception:  # one stream's bookkeeping must not drop the others'
                log.exception("follow_read_failed", subject=msg.subject)

    async def unfollow(self, request_id: str) -> None:
        how = self._by_id.pop(request_id, None)
        if isinstance(how, str):
            if (taps := self.local()) is not None:
                taps.untap(how)
        elif how is not None:
            with contextlib.suppress(Exception):
                await how.unsubscribe()
