"""The client's first-token path (shared/client.py, shared/nats_internals.py): a relay's request is on
the wire when its stream first yields (`published=True`: the edge sets up its answer while the
request travels, instead of before it leaves), and each event reaches its stream's inbox from
nats-py's reader in the same turn (nats_internals.deliver_directly), not through the subscription's
task. Against the session's secured nats-server, a fake admission answering as the operator."""

from __future__ import annotations

import asyncio
import contextlib

from nats import micro
from tokenyard.shared import codec, nats_internals, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.test_client_mux import USAGE, chunks, scripted


async def test_deliver_directly_hands_each_message_over_in_the_readers_turn(nats_server):
    nc = await natsutil.connect(nats_server.url, "direct")
    via_task: list = []
    got: list[bytes] = []

    async def cb(msg) -> None:
        via_task.append(msg)

    try:
        sub = await nc.subscribe("direct.test", cb=cb)
        assert nats_internals.deliver_directly(sub, lambda msg: got.append(msg.data))
        for i in range(50):
            await nc.publish("direct.test", str(i).encode())
        await nc.flush()
        await until(lambda: len(got) == 50, what="50 messages delivered")
        assert got == [str(i).encode() for i in range(50)]  # in order, every one
        assert via_task == []  # none went through the subscription's task
        assert sub.pending_msgs == 0 and sub.pending_bytes == 0  # nothing counted as waiting
        task = sub._wait_for_msgs_task  # nats-py has no public handle on a subscription's task
        await sub.unsubscribe()
        await until(lambda: task.done(), what="the subscription's idle task ended")
    finally:
        await nc.close()


async def _unused(msg) -> None:
    raise AssertionError("delivered through the subscription's task")


async def test_a_delivery_that_raises_leaves_the_connection_reading(nats_server):
    nc = await natsutil.connect(nats_server.url, "direct-raise")
    got: list[bytes] = []

    def deliver(msg) -> None:
        if msg.data == b"bad":
            raise ValueError("a bug in a deliver function")
        got.append(msg.data)

    try:
        sub = await nc.subscribe("direct.raise", cb=_unused)
        nats_internals.deliver_directly(sub, deliver)
        for data in (b"1", b"bad", b"2"):
            await nc.publish("direct.raise", data)
        await nc.flush()
        await until(lambda: got == [b"1", b"2"], what="the message after the failed one")
        assert nc.is_connected
    finally:
        await nc.close()


async def test_a_streams_events_reach_its_inbox_without_the_subscriptions_task(nats_server):
    async with scripted(nats_server.url) as (fake, client):
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="direct"))
        assert [type(e) for e in await anext(batches)] == [schemas.Accepted]
        task = client._mux._wait_for_msgs_task  # what handed each message over before (nats-py's, no public handle)
        task.cancel()
        await until(lambda: task.done(), what="the subscription's task stopped")
        await fake.send("direct", *chunks("direct", "abc"), schemas.Finished("direct", 3, "stop", USAGE))
        out = await asyncio.wait_for(anext(batches), 10.0)  # still delivered: by the reader itself
        assert [e.text for e in out[:-1]] == list("abc") and isinstance(out[-1], schemas.Finished)
        assert client._mux.pending_bytes == 0
        await batches.aclose()


async def test_streams_get_numbered_inboxes_under_the_clients_random_token(nats_server):
    async with scripted(nats_server.url) as (fake, client):
        for rid in ("n0", "n1", "n2"):
            batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id=rid))
            await anext(batches)
            await batches.aclose()
        inboxes = [fake.inbox[r] for r in ("n0", "n1", "n2")]
        base = inboxes[0].rsplit(".", 1)[0]
        assert [i.rsplit(".", 1)[0] for i in inboxes] == [base] * 3
        assert base.endswith("." + client.lease_id)  # the lease (16 random hex digits) makes them this client's
        lasts = [i.rsplit(".", 1)[1] for i in inboxes]  # a number, then 12 random hex digits
        assert [t[:-12] for t in lasts] == ["0", "1", "2"] and all(len(set(t[-12:])) > 1 for t in lasts)
        assert len({t[-12:] for t in lasts}) == 3


async def test_a_published_stream_has_sent_its_request_when_it_first_yields(nats_server):
    op = await natsutil.connect(nats_server.url, "fake-admission")
    seen: list[schemas.GenerateRequest] = []

    async def on_submit(msg) -> None:
        seen.append(codec.decode(msg.data, schemas.GenerateRequest))

    await op.subscribe(subjects.SUBMIT, cb=on_submit)
    await op.flush()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="early"), published=True)
        assert await anext(batches) == []  # at once: nothing has answered yet
        assert client.nc._pending_data_size == 0  # left this process before the yield (nats-py's count, no public one)
        await until(lambda: [r.request_id for r in seen] == ["early"], what="the submit arrived")
        next_batch = asyncio.ensure_future(anext(batches))
        await asyncio.sleep(0.05)
        assert not next_batch.done()  # the stream now waits for events as usual
        next_batch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await next_batch
    finally:
        await client.close()
        await op.close()


async def test_an_event_of_another_request_on_a_streams_inbox_is_not_its_answer(nats_server):
    """Another client's submit that names this stream's inbox as its reply makes the fleet stream
    that request's events there: the stream hands on only its own request's events."""
    async with scripted(nats_server.url) as (fake, client):
        events = []
        async for e in client.stream(schemas.GenerateRequest(prompt="x", request_id="mine")):
            events.append(e)
            if isinstance(e, schemas.Accepted):
                fake.inbox["evil"] = fake.inbox["mine"]  # the injected request's reply: this inbox
                await fake.send("evil", schemas.Accepted("evil", 1, 5), *chunks("evil", "PWNED"),
                                schemas.Finished("evil", 5, "stop", USAGE))
                await fake.send("mine", *chunks("mine", "ok"), schemas.Finished("mine", 2, "stop", USAGE))
        assert {e.request_id for e in events} == {"mine"}
        assert "".join(e.text for e in events if isinstance(e, schemas.Chunk)) == "ok"
        assert isinstance(events[-1], schemas.Finished) and events[-1].seq == 2


async def test_a_micro_endpoint_handled_directly_answers_in_the_readers_turn_and_counts_its_requests(nats_server):
    """The worker's generate endpoint (nats_internals.handle_directly): each request's handler starts
    as nats-py's reader parses it — still answered with the endpoint's subscription task
    stopped — and nats.micro's wrapper still counts it in the endpoint's stats."""
    nc = await natsutil.connect(nats_server.url, "direct-micro")
    started_in: list = []

    async def handler(req) -> None:
        started_in.append(asyncio.current_task())
        await req.respond(b"ok:" + req.data)

    try:
        service = await micro.add_service(nc, name="direct-test", version="0.0.1")
        await service.add_endpoint(name="offer", subject="direct.micro", handler=handler)
        assert nats_internals.handle_directly(service, "direct.micro")
        assert not nats_internals.handle_directly(service, "no.such.endpoint")
        task = service._endpoints[0]._subscription._wait_for_msgs_task  # nats.micro's own, no public handle
        task.cancel()
        await until(lambda: task.done(), what="the endpoint's subscription task stopped")
        answers = [await nc.request("direct.micro", str(i).encode(), timeout=5) for i in range(3)]
        assert [a.data for a in answers] == [b"ok:0", b"ok:1", b"ok:2"]
        assert len(set(started_in)) == 3 and task not in started_in  # a task of its own each, not the subscription's
        stats = service.stats()
        assert stats.endpoints[0].num_requests == 3 and stats.endpoints[0].num_errors == 0
        await service.stop()
    finally:
        await nc.close()
