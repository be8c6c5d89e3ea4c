"""An abort that reaches the queue while a request's route is being asked: if the router then
places it nowhere (no worker had room), the request leaves instead of going back in line to
wait for the next worker's room. An abort that names a reply subject (a reused id's newcomer,
answered 409 by admission after `withdraw` found it on its way) stops that generation alone,
quietly (its stream has had its end), and leaves another generation of the id alone.

A queue shell on a real nats-server with a router in its process that the test answers by
hand (a LocalRouter): the route is held open while the abort arrives, then answered."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from tests.builders import hb, req
from tests.conftest import until


class HeldRouter:
    """A router in the queue's process whose answers the test gives: each ask waits for
    `answer` (NO_CAPACITY unless told), and only the first ask is answered before the test
    ends (`closing`): a second ask, of a request put back in line, stays open."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.data: list[bytes | None] = []
        """Each ask's `data`: the request as the queue sends it on."""
        self.answer = asyncio.Event()
        self.outcome = schemas.Outcome.NO_CAPACITY
        self.asked_event = asyncio.Event()
        self.closing = asyncio.Event()

    async def route(self, ar, data=None, headers=None, only=None) -> schemas.RouteDecision:
        self.asked.append(ar.request_id)
        self.data.append(data)
        self.asked_event.set()
        await (self.answer if len(self.asked) == 1 else self.closing).wait()
        return schemas.RouteDecision(ar.request_id, self.outcome, worker_id="qa0" if self.outcome == "routed" else "")


async def start(url: str) -> tuple[ServiceHost, QueueShell, HeldRouter]:
    nc = await natsutil.connect(url, "queue-abort-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    router = HeldRouter()
    queue = QueueShell(QueueConfig(), FCFS(), router=router)
    queue.aborts_heard = 0
    on_abort = queue.on_abort

    async def counting(msg) -> None:  # the subscription's handler, counted: a test awaits it
        await on_abort(msg)
        queue.aborts_heard += 1

    queue.on_abort = counting
    host = await ServiceHost(queue, url).start()
    queue.core.on_heartbeat(hb("qa0", ts=time.time()), time.time())  # one worker with room: a take is released
    return host, queue, router


async def inbox(url: str, subject: str) -> tuple[object, list]:
    nc = await natsutil.connect(url, "queue-abort-client")
    got: list = []

    async def note(msg) -> None:
        got.append(codec.decode(msg.data, schemas.StreamEvent))

    await nc.subscribe(subject, cb=note)
    await nc.flush()
    return nc, got


async def abort(url: str, abort: schemas.Abort) -> None:
    nc = await natsutil.connect(url, "queue-abort-sender")
    try:
        await nc.publish(subjects.ABORT, codec.encode(abort))
        await nc.flush()
    finally:
        await nc.drain()


async def settled(queue: QueueShell, nc) -> None:
    """Whatever the queue was going to publish has reached the test's subscription: its route
    tasks are done, then both connections flushed (the queue's, then the reader's round trip)."""
    await until(lambda: queue.kept()["routes"] == 0, what="its routes answered")
    await queue.nc.flush()
    await nc.flush()


def handed(queue: QueueShell, rid: str, reply_to: str) -> None:
    r = req(rid, reply_to=reply_to, arrival_s=time.time())
    assert queue.take(r, msgspec.msgpack.encode(r), {}) is not None


@pytest.mark.parametrize("outcome", [schemas.Outcome.NO_CAPACITY, schemas.Outcome.ABORTED])
async def test_a_withdrawn_newcomer_that_the_router_places_nowhere_leaves_the_queue(nats_server, outcome):
    """The reused id's newcomer: `withdraw` finds it on its way (False), admission answers 409
    and publishes the abort that names its reply subject; the router then answers no capacity
    (before: it went back in line, and waited for a worker, which refuses it, or its expiry), or
    `aborted`, the worker having heard the abort first (before: a `finished: abort` followed the
    409, a second end to its stream)."""
    host, queue, router = await start(nats_server.url)
    nc, got = await inbox(nats_server.url, "_INBOX.new")
    try:
        handed(queue, "dup", "_INBOX.new")
        await asyncio.wait_for(router.asked_event.wait(), 20)  # bounded: a missed step fails, not hangs
        assert queue.withdraw("dup") is False  # on its way
        await abort(nats_server.url, schemas.Abort("dup", reason="duplicate_request_id", reply_to="_INBOX.new"))
        router.outcome = outcome
        router.answer.set()
        await until(lambda: not queue.core.in_flight and len(queue.core) == 0, what="the newcomer gone")
        assert router.asked == ["dup"]  # asked once: not put back in line
        assert not queue.core.stopping and (queue.kept()["local"], queue.kept()["placing"]) == (0, 0)
        await settled(queue, nc)
        assert got == []  # admission ended its stream (409): the queue adds nothing after that end
    finally:
        await nc.drain()
        router.answer.set()
        router.closing.set()
        await host.stop()


async def test_an_abort_naming_another_reply_subject_leaves_the_generation_on_its_way_alone(nats_server):
    """The abort is for the id's newcomer elsewhere (another replica's): this queue's request of
    the id, its first, goes back in line as any request the router placed nowhere."""
    host, queue, router = await start(nats_server.url)
    try:
        handed(queue, "dup", "_INBOX.first")
        await asyncio.wait_for(router.asked_event.wait(), 20)  # bounded: a missed step fails, not hangs
        await abort(nats_server.url, schemas.Abort("dup", reason="duplicate_request_id", reply_to="_INBOX.other"))
        await until(lambda: queue.aborts_heard == 1, what="the abort heard")
        assert queue.core.stopping == {}
        router.answer.set()
        await until(lambda: len(router.asked) == 2, what="the first asked about again")
        assert "dup" in queue.core.in_flight and queue.core.in_flight["dup"].reply_to == "_INBOX.first"
    finally:
        router.answer.set()
        router.closing.set()
        await host.stop()


@pytest.mark.parametrize("reason, reply_to", [("client", ""), ("client_left", "_INBOX.gone")])
async def test_a_client_abort_during_the_route_ends_the_stream_when_the_router_places_it_nowhere(nats_server, reason,
                                                                                                   reply_to):
    """A plain abort, or a TokenyardClient reader's `break` naming its own stream (review of round
    9: that one was taken for admission's 409 — its stream counted as ended, its stored copy never
    settled)."""
    host, queue, router = await start(nats_server.url)
    nc, got = await inbox(nats_server.url, "_INBOX.gone")
    try:
        handed(queue, "gone", "_INBOX.gone")
        await asyncio.wait_for(router.asked_event.wait(), 20)  # bounded: a missed step fails, not hangs
        await abort(nats_server.url, schemas.Abort("gone", reason=reason, reply_to=reply_to))
        await until(lambda: "gone" in queue.core.stopping, what="the abort heard")
        router.answer.set()
        await until(lambda: got, what="the stream's end")
        assert [(type(e).__name__, e.finish_reason) for e in got] == [("Finished", "abort")]
        assert router.asked == ["gone"] and len(queue.core) == 0 and not queue.core.in_flight
    finally:
        await nc.drain()
        router.answer.set()
        router.closing.set()
        await host.stop()


async def test_a_request_placed_after_an_abort_reached_it_on_its_way_is_the_workers_to_stop(nats_server):
    host, queue, router = await start(nats_server.url)
    try:
        router.outcome = schemas.Outcome.ROUTED
        handed(queue, "placed", "_INBOX.placed")
        await asyncio.wait_for(router.asked_event.wait(), 20)  # bounded: a missed step fails, not hangs
        await abort(nats_server.url, schemas.Abort("placed", reason="client"))
        await until(lambda: "placed" in queue.core.stopping, what="the abort heard")
        router.answer.set()
        await until(lambda: not queue.core.in_flight, what="routed")
        assert queue.core.stopping == {} and len(queue.core) == 0 and router.asked == ["placed"]
    finally:
        router.answer.set()
        router.closing.set()
        await host.stop()
