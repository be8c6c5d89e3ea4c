"""How a router follows a stream (services/router/follow.py): a stream of a client in its own
process is tapped on that client's inbox subscription (TokenyardClient.tap), any other is
subscribed to. Either way the router reads the same NATS messages until the stream's end; a
tapped one after the client's own reader has had them, and never admission's in-process
answers (which never crossed NATS). Over a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from tokenyard.services.router.follow import Follows
from tokenyard.shared import codec, natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until

USAGE = schemas.Usage(3, 2, 5)


class HeldAdmission:
    """Admission in the client's process that accepts at once (an in-process answer) and
    leaves the stream to whoever publishes on its reply subject."""

    def __init__(self) -> None:
        self.reply_to: str = ""

    async def submit(self, body, reply_to, headers, respond) -> None:
        self.reply_to = reply_to
        await respond(codec.encode(schemas.Accepted(body.request_id, 1, 3)))


class Reader:
    """A stream read as the edge reads it, and what was still unread each time the router read."""

    def __init__(self, client: TokenyardClient) -> None:
        self.client, self.events, self.unread_when_router_read = client, [], []
        self.router_read: list[str] = []

    async def run(self, req: schemas.GenerateRequest) -> None:
        async for batch in self.client.stream_batches(req, published=True):
            self.events += [type(e).__name__ for e in batch]

    def seen(self, msg) -> bool:
        event = codec.decode_event(msg.data, msg.headers)
        self.router_read.append(type(event).__name__)
        self.unread_when_router_read.append(sum(self.client.open_streams().values()))
        return isinstance(event, schemas.TERMINAL_EVENTS)


@pytest.fixture
async def nats():
    server = await natsutil.NatsServer().start()
    conns = []

    async def connect(name: str):
        conns.append(await natsutil.connect(server.url, name))
        return conns[-1]

    yield connect
    for nc in conns:
        await nc.close()
    server.stop()


class Scene:
    """A client with one stream open (request r1), a router's Follows that taps that client, and
    a "worker" connection that publishes on the stream's reply subject."""

    @classmethod
    async def open(cls, nats) -> Scene:
        self = cls()
        self.admission = HeldAdmission()
        self.client = TokenyardClient(await nats("edge"), admission=self.admission)
        self.follows = Follows()
        self.follows.nc, self.follows.local = await nats("router"), lambda: self.client
        self.worker = await nats("worker")
        self.reader = Reader(self.client)
        self.streaming = asyncio.create_task(
            self.reader.run(schemas.GenerateRequest(prompt="hi", request_id="r1", max_tokens=2)))
        await until(lambda: self.admission.reply_to != "", what="the stream's inbox")
        self.inbox = self.admission.reply_to
        return self

    async def publish(self, subject: str, *events: schemas.StreamEvent) -> None:
        for event in events:
            await self.worker.publish(subject, codec.encode(event))

    async def stream_ends(self) -> None:
        async with asyncio.timeout(5):
            await self.streaming


async def test_a_stream_of_a_client_in_this_process_is_tapped_and_read_after_the_client(nats):
    scene = await Scene.open(nats)
    follows, reader = scene.follows, scene.reader
    await follows.follow("r1", scene.inbox, reader.seen)
    assert follows.tapped("r1") and list(follows) == ["r1"]
    await scene.publish(scene.inbox, schemas.Chunk("r1", 0, "a", [97]), schemas.Chunk("r1", 1, "b", [98]),
                        schemas.Finished("r1", 2, "length", USAGE))
    await scene.stream_ends()
    assert reader.events == ["Accepted", "Chunk", "Chunk", "Finished"]
    await until(lambda: "r1" not in follows, what="the follow ending with the stream")
    # the NATS events only (admission's `accepted` never crossed NATS), each read by the
    # client's reader before the router's tap read it
    assert reader.router_read == ["Chunk", "Chunk", "Finished"]
    assert reader.unread_when_router_read == [0, 0, 0]
    await scene.publish(scene.inbox, schemas.Chunk("r1", 3, "c", [99]))
    await scene.worker.flush()
    await asyncio.sleep(0.1)
    assert reader.router_read == ["Chunk", "Chunk", "Finished"]  # untapped at the end
    await scene.client.close()


async def test_a_subject_that_is_not_the_clients_is_subscribed_to_and_so_is_one_of_a_closed_client(nats):
    scene = await Scene.open(nats)
    follows, reader = scene.follows, scene.reader
    await follows.follow("r2", "_INBOX.elsewhere.r2", reader.seen)
    # a router sends its offer after the SUB on the same connection, so the worker's reply comes
    # after it; here another connection publishes, so the SUB must reach the server first
    await follows.nc.flush()
    assert not follows.tapped("r2") and "r2" in follows
    await follows.follow("r1", scene.inbox, reader.seen)
    await follows.unfollow("r1")  # before its end: the tap goes
    await scene.publish("_INBOX.elsewhere.r2", schemas.Finished("r2", 0, "length", USAGE))
    await scene.publish(scene.inbox, schemas.Finished("r1", 0, "length", USAGE))
    await scene.stream_ends()
    await until(lambda: "r2" not in follows, what="the subscription ending with its stream")
    assert reader.router_read == ["Finished"]  # r2's: r1 was no longer followed
    await scene.client.close()
    await follows.follow("r3", scene.inbox, reader.seen)  # a closed client taps nothing
    assert "r3" in follows and not follows.tapped("r3")
    await follows.unfollow("r3")


async def test_a_tap_that_fails_leaves_the_clients_stream_whole(nats):
    scene = await Scene.open(nats)

    def broken(msg) -> None:
        raise RuntimeError("a bug in the router's bookkeeping")

    assert scene.client.tap(scene.inbox, broken)
    await scene.publish(scene.inbox, schemas.Chunk("r1", 0, "a", [97]), schemas.Finished("r1", 1, "length", USAGE))
    await scene.stream_ends()
    assert scene.reader.events == ["Accepted", "Chunk", "Finished"]
    assert not scene.client.tap("_INBOX.someone-else.x", broken)
    await scene.client.close()
