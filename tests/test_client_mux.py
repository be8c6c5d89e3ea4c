"""The client's streams on one subscription (shared/client.py): each stream reads only its own
events, a burst that arrived while its reader was away comes as one batch, no request adds a
subscription, a client without a lease has no lease in its inboxes, and beside an in-process
admission the subscription is the server's before the request is handed over. Against the session's
secured nats-server, the client connected as the user `client`, a hand-written fake admission
answering `llm.v1.submit` as the operator."""

from __future__ import annotations

import asyncio
import contextlib

from tokenyard.services.router.migration import lease_of
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.test_natsutil_flush_order import record_writes

USAGE = schemas.Usage(5, 3, 8)


class Scripted:
    """Admission and worker in one: answers each submit with `accepted`, then holds the
    request until the test says what to send (`send`)."""

    def __init__(self, nc):
        self.nc = nc
        self.inbox: dict[str, str] = {}  # request id → reply subject

    async def start(self) -> Scripted:
        await self.nc.subscribe(subjects.SUBMIT, cb=self._on_submit)
        await self.nc.flush()
        return self

    async def _on_submit(self, msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest)
        self.inbox[req.request_id] = msg.reply
        await self.nc.publish(msg.reply, codec.encode(schemas.Accepted(req.request_id, 1, 5)))

    async def send(self, rid: str, *events) -> None:
        for e in events:
            await self.nc.publish(self.inbox[rid], codec.encode(e))
        await self.nc.flush()


@contextlib.asynccontextmanager
async def scripted(url: str):
    """(a Scripted fake admission answering as the operator, a TokenyardClient as `client`),
    both closed at the end."""
    op = await natsutil.connect(url, "fake-admission")
    fake = await Scripted(op).start()
    client = await TokenyardClient.connect(url)
    try:
        yield fake, client
    finally:
        await client.close()
        await op.close()


def chunks(rid: str, texts: str, start: int = 0) -> list[schemas.Chunk]:
    return [schemas.Chunk(rid, start + i, t, [start + i]) for i, t in enumerate(texts)]


async def test_streams_share_one_subscription_and_each_reads_its_own(nats_server):
    op = await natsutil.connect(nats_server.url, "fake-admission")
    fake = await Scripted(op).start()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        async def one(rid: str, texts: str) -> list:
            events = []
            async for e in client.stream(schemas.GenerateRequest(prompt="x", request_id=rid)):
                events.append(e)
                if isinstance(e, schemas.Accepted):  # answer only once this stream is listening
                    await fake.send(rid, *chunks(rid, texts), schemas.Finished(rid, len(texts), "stop", USAGE))
            return events

        a, b = await asyncio.gather(one("mux-a", "abc"), one("mux-b", "wxyz"))
        assert [e.text for e in a if isinstance(e, schemas.Chunk)] == list("abc")
        assert [e.text for e in b if isinstance(e, schemas.Chunk)] == list("wxyz")
        assert {e.request_id for e in a} == {"mux-a"} and {e.request_id for e in b} == {"mux-b"}
        subs = len(client.nc._subs)  # (nats-py's own count: no public one) the streams' one and the lease's `alive`
        assert subs == 2
        await fake.send("mux-a", schemas.Chunk("mux-a", 3, "late", [3]))  # to an inbox no stream reads now
        for i in range(5):
            assert [type(e) for e in await one(f"mux-{i}", "k")] == [schemas.Accepted, schemas.Chunk, schemas.Finished]
        assert len(client.nc._subs) == subs  # requests add no subscription
        assert client.open_streams() == {}  # nor leave an inbox behind
    finally:
        await client.close()
        await op.close()


async def test_a_burst_that_arrived_meanwhile_is_one_batch(nats_server):
    op = await natsutil.connect(nats_server.url, "fake-admission")
    fake = await Scripted(op).start()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="burst"))
        first = await anext(batches)
        assert [type(e) for e in first] == [schemas.Accepted]
        await fake.send("burst", *chunks("burst", "hello"), schemas.Finished("burst", 5, "stop", USAGE))
        await until(lambda: client.open_streams() == {"burst": 6})  # all of it came while the reader was away
        burst = await anext(batches)
        assert [getattr(e, "seq", None) for e in burst] == [0, 1, 2, 3, 4, 5]
        assert isinstance(burst[-1], schemas.Finished)
        await batches.aclose()
    finally:
        await client.close()
        await op.close()


async def test_a_burst_with_a_repeat_and_a_gap_filled_in_it_comes_out_in_order(nats_server):
    """The stream check runs over the whole batch: a repeated chunk is dropped, chunks after a
    hole wait for it, and the batch holds the stream in order."""
    op = await natsutil.connect(nats_server.url, "fake-admission")
    fake = await Scripted(op).start()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="holes"))
        await anext(batches)
        c = chunks("holes", "abcd")
        await fake.send("holes", c[0], c[2], c[0], c[3], c[1], schemas.Finished("holes", 4, "stop", USAGE))
        await until(lambda: client.open_streams() == {"holes": 6})
        out = await anext(batches)
        assert [e.text for e in out[:-1]] == list("abcd") and isinstance(out[-1], schemas.Finished)
        await batches.aclose()
    finally:
        await client.close()
        await op.close()


async def test_a_client_without_a_lease_has_none_in_its_inboxes(nats_server):
    op = await natsutil.connect(nats_server.url, "fake-admission")
    fake = await Scripted(op).start()
    nc = await natsutil.connect(nats_server.url, "unleased")
    client = TokenyardClient(nc, lease=False)
    try:
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="nolease"))
        assert isinstance((await anext(batches))[0], schemas.Accepted)
        assert lease_of(fake.inbox["nolease"]) == ""  # a router never probes or orphans it
        await fake.send("nolease", schemas.Finished("nolease", 0, "stop", USAGE))
        assert isinstance((await anext(batches))[-1], schemas.Finished)
        assert not client.leasing
    finally:
        await client.close()
        await nc.close()
        await op.close()


async def test_close_ends_every_open_stream_with_a_clear_error_and_aborts_it(nats_server):
    """A caller awaiting tokens when its client closes gets an `error` 499 at once (it used to
    wait out the 60 s idle watchdog, then fail publishing the abort on a drained connection),
    each open request is aborted, and a stream asked of the closed client ends the same way."""
    op = await natsutil.connect(nats_server.url, "fake-admission")
    fake = await Scripted(op).start()
    aborts: list[schemas.Abort] = []

    async def on_abort(msg) -> None:
        aborts.append(codec.decode(msg.data, schemas.Abort))

    await op.subscribe(subjects.ABORT, cb=on_abort)
    await op.flush()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        seen: dict[str, list] = {"open-a": [], "open-b": []}

        async def read(rid: str) -> list:
            async for e in client.stream(schemas.GenerateRequest(prompt="x", request_id=rid)):
                seen[rid].append(e)
                if isinstance(e, schemas.Accepted):
                    await fake.send(rid, *chunks(rid, "ab"))
            return seen[rid]

        readers = [asyncio.create_task(read(rid)) for rid in seen]
        await until(lambda: all(len(events) == 3 for events in seen.values()))  # both awaiting a third chunk
        await client.close()
        async with asyncio.timeout(5):
            a, b = await asyncio.gather(*readers)
        for rid, events in (("open-a", a), ("open-b", b)):
            last = events[-1]
            assert isinstance(last, schemas.Error) and last.status == 499 and "client was closed" in last.message
            assert [type(e) for e in events[:-1]] == [schemas.Accepted, schemas.Chunk, schemas.Chunk]
            assert last.request_id == rid and last.seq == 2
        await until(lambda: len(aborts) == 2)
        assert sorted((x.request_id, x.reason) for x in aborts) == [("open-a", "client_closed"),
                                                                     ("open-b", "client_closed")]
        assert client.open_streams() == {}
        late = await client.generate(schemas.GenerateRequest(prompt="x", request_id="late"))
        assert late.error is not None and late.error.status == 499 and "late" not in fake.inbox
    finally:
        await client.close()
        await op.close()


async def test_beside_an_in_process_admission_the_subscription_is_the_servers_before_the_request_is_handed_over(
        nats_server):
    """An edge in the queue's process hands its request to admission by a call: the first event can
    come from another connection (the worker the router there offered it to) with none of this
    connection's bytes after the SUB to order it. The flush that opens the inbox writes the SUB
    before its PING (natsutil.connect), so by the hand-over the server has the subscription, and a
    worker that publishes at once is heard."""
    nc = await natsutil.connect(nats_server.url, "in-process-edge")
    worker = await natsutil.connect(nats_server.url, "eager-worker")
    writes = record_writes(nc)
    at_hand_over: list[bytes] = []

    class Admission:  # accepts in-process; the worker streams the end at once, from its own connection
        async def submit(self, body, reply_to, headers, respond) -> None:
            at_hand_over.extend(writes)
            await respond(codec.encode(schemas.Accepted(body.request_id, 1, 5)))
            await worker.publish(reply_to, codec.encode(schemas.Finished(body.request_id, 0, "stop", USAGE)))
            await worker.flush()

    client = TokenyardClient(nc, admission=Admission(), lease=False)
    try:
        async with asyncio.timeout(10):
            events = [e async for e in client.stream(schemas.GenerateRequest(prompt="x", request_id="handed"))]
        assert [type(e) for e in events] == [schemas.Accepted, schemas.Finished]
        sub, ping = at_hand_over
        assert sub.startswith(b"SUB _INBOX.") and ping == b"PING\r\n"
    finally:
        await client.close()
        await worker.close()
        await nc.close()


async def test_a_clients_lease_ends_with_its_connection_closed_under_it(nats_server):
    """A connection closed by its owner without `client.close()` (a process's own shutdown, a
    vanishing client in bench/soak.py): the lease task ended with it, not at the process's end."""
    op = await natsutil.connect(nats_server.url, "fake-admission")
    await Scripted(op).start()
    nc = await natsutil.connect(nats_server.url, "closed-under")
    client = TokenyardClient(nc)
    try:
        batches = client.stream_batches(schemas.GenerateRequest(prompt="x", request_id="underneath"))
        assert isinstance((await anext(batches))[0], schemas.Accepted)
        assert client.leasing
        await nc.close()
        await until(lambda: not client.leasing, timeout_s=5.0, what="the lease task's end")
        await batches.aclose()
    finally:
        await client.close()
        await op.close()
