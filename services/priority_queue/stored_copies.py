"""Deleting a request's stored JetStream copy by its stream sequence (the queue shell's
hand-over): once a request admission handed over in-process is routed and its store is acked,
its copy in LLM_QUEUE is deleted (JetStream's message delete, `no_erase`), so no other queue
replica can place it a second time. Each delete runs as a task of its own, awaited by nobody
but `close`: one that fails only leaves the copy to be acked when it comes back, as before
deletes. A copy that came to this replica before its store's ack (`came`: the replica acks it
itself) is not deleted a second time: its sequence is remembered (the last CAME_REMEMBERED)
and its delete not sent (round 8's queue-replica-kill logged 142 such deletes that found
nothing). One that meets the copy on its way still finds it gone (error 10057), quietly."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

import msgspec
from nats.aio.client import Client
from tokenyard.shared import subjects, telemetry

log = telemetry.logger("queue")

DELETE_SUBJECT = f"$JS.API.STREAM.MSG.DELETE.{subjects.QUEUE_STREAM}"
DELETE_TIMEOUT_S = 2.0
NO_SUCH_MESSAGE = 10057
CAME_REMEMBERED = 4096
"""Sequences of copies that came here, remembered for their store's ack (which trails by a
round trip; the oldest are forgotten first)."""


class StoredCopies:
    def __init__(self) -> None:
        self.nc: Client | None = None
        self._tasks: set[asyncio.Task] = set()
        self._came: OrderedDict[int, None] = OrderedDict()
        self.sent = 0
        """Deletes sent."""

    def came(self, msg) -> None:
        """A handed-over request's stored copy came to this replica, which acks it: its delete,
        should its store's ack come later, is not sent."""
        with contextlib.suppress(Exception):  # a message without JetStream metadata: nothing to skip
            self._came[msg.metadata.sequence.stream] = None
            while len(self._came) > CAME_REMEMBERED:
                self._came.popitem(last=False)

    def delete(self, seq: int) -> None:
        if self._came.pop(seq, 0) is None:  # acked here already: nothing left to delete
            return
        self.sent += 1
        task = asyncio.create_task(self._delete(seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Let the deletes on their way finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _delete(self, seq: int) -> None:
        body = msgspec.json.encode({"seq": seq, "no_erase": True})
        try:
            reply = await self.nc.request(DELETE_SUBJECT, body, timeout=DELETE_TIMEOUT_S)
            answer = msgspec.json.decode(reply.data)
        except Exception as e:
            log.warning("stored_copy_not_deleted", seq=seq, error=repr(e))
            return
        error = answer.get("error") if isinstance(answer, dict) else None
        if error and error.get("err_code") != NO_SUCH_MESSAGE:
            log.warning("stored_copy_not_deleted", seq=seq, error=error)
