"""Deleting a request's stored JetStream copy by its stream sequence (the queue shell's
hand-over): once a request admission handed over in-process is routed and its store is acked,
its copy in LLM_QUEUE is deleted (JetStream's message delete, `no_erase`), so no other queue
replica can place it a second time. Each delete runs as a task of its own, awaited by nobody
but `close`: one that fails (or finds the message gone — error 10057: it reached this replica
and was acked) only leaves the copy to be acked when it comes back, as before deletes."""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.client import Client
from tokenyard.shared import subjects, telemetry

log = telemetry.logger("queue")

DELETE_SUBJECT = f"$JS.API.STREAM.MSG.DELETE.{subjects.QUEUE_STREAM}"
DELETE_TIMEOUT_S = 2.0
NO_SUCH_MESSAGE = 10057


class StoredCopies:
    def __init__(self) -> None:
        self.nc: Client | None = None
        self._tasks: set[asyncio.Task] = set()

    def delete(self, seq: int) -> None:
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
