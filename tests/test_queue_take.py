"""`take`, admission's hand-over in the queue's process, and its fast path: with nothing due to
expire, the request is released in `take`'s own turn (its route starts on the loop's next step,
not after the dispatch loop's turn); with a waiting request past its deadline, that one is
answered first (the dispatch loop's turn: expiry, then release). A reused id (one this queue
had within JetStream's window, or holds now) is not taken: JetStream's duplicate check decides.

A queue shell on a real nats-server with a router in its process that the test answers
(tests/test_queue_abort.py HeldRouter)."""

from __future__ import annotations

import asyncio
import time

import msgspec
from tokenyard.shared import codec, schemas

from tests.builders import hb, req
from tests.conftest import until
from tests.test_queue_abort import inbox, start


def offered(rid: str, **fields) -> tuple[schemas.AdmittedRequest, bytes]:
    r = req(rid, reply_to=f"_INBOX.{rid}", arrival_s=fields.pop("arrival_s", time.time()), **fields)
    return r, msgspec.msgpack.encode(r)


TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


async def test_a_taken_request_with_room_is_released_in_takes_own_turn(nats_server, spans):
    host, queue, router = await start(nats_server.url)
    try:
        r, data = offered("fast")
        spans.clear()
        placing = queue.take(r, data, {"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"})
        # no await since: the route task exists and the request is in flight already
        assert placing is not None and not placing.done()
        assert list(queue.core.in_flight) == ["fast"] and queue.kept()["routes"] == 1
        await asyncio.wait_for(router.asked_event.wait(), 20)  # bounded: a missed step fails, not hangs
        assert router.asked == ["fast"] and router.data == [data]  # its encoding goes to the router as is
        router.outcome = schemas.Outcome.ROUTED
        router.answer.set()
        await until(lambda: placing.done() and not queue.core.in_flight, what="routed")
        assert (queue.kept()["local"], queue.kept()["placing"]) == (0, 0)  # nothing kept for it
        traces = [f"{s.context.trace_id:032x}" for s in spans.get_finished_spans()
                  if s.attributes.get("tokenyard.service") == "queue" and s.name.startswith("process")]
        assert traces == [TRACE_ID]  # its trace context came with it
    finally:
        router.answer.set()
        router.closing.set()
        await host.stop()


async def test_with_a_request_past_its_deadline_waiting_take_leaves_the_release_to_the_loop(nats_server):
    host, queue, router = await start(nats_server.url)
    nc, got = await inbox(nats_server.url, "_INBOX.old")
    try:
        now = time.time()
        queue.core.workers.clear()  # no room: the old one waits
        old, _ = offered("old", priority=1, arrival_s=now - 100.0)
        assert queue.core.offer(old, now)
        queue.core.on_heartbeat(hb("qa0", ts=now), now)  # room again, in the same turn
        r, data = offered("new", priority=1)
        assert queue.take(r, data, {}) is not None
        assert queue.kept()["routes"] == 0 and "new" not in queue.core.in_flight  # not in take's turn
        await until(lambda: got, what="the old one's answer")
        assert [(type(e).__name__, e.status, e.code) for e in got] == [("Rejected", 429, "deadline_exceeded")]
        await until(lambda: router.asked == ["new"], what="the new one routed by the loop")
        assert "old" not in queue.core.in_flight and len(queue.core) == 0
    finally:
        router.answer.set()
        router.closing.set()
        await nc.drain()
        await host.stop()


async def test_an_id_the_queue_holds_or_had_is_not_taken(nats_server):
    host, queue, router = await start(nats_server.url)
    try:
        r, data = offered("twice")
        assert queue.take(r, data, {}) is not None
        assert queue.take(r, data, {}) is None  # on its way: the same id again
        router.outcome = schemas.Outcome.ROUTED
        router.answer.set()
        await until(lambda: not queue.core.in_flight, what="routed")
        assert queue.take(r, data, {}) is None  # within JetStream's window: its duplicate check answers
        assert router.asked == ["twice"] and codec.decode(data, schemas.AdmittedRequest).request_id == "twice"
    finally:
        router.answer.set()
        router.closing.set()
        await host.stop()
