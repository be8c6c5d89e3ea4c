"""A flush on a natsutil.connect connection returns once the server has processed everything sent
before it, the SUB just queued included; on a bare nats-py client its PING overtakes that SUB."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from tokenyard.shared import natsutil


def record_writes(nc) -> list[bytes]:
    """What the connection writes to its socket from now on, one entry per write that has bytes
    (nats-py's flusher also writes an empty list). nats-py has no public view of its writes: its
    transport's two write methods are wrapped."""
    writes: list[bytes] = []
    transport = nc._transport
    write, writelines = transport.write, transport.writelines

    def note(data: bytes) -> None:
        if data:
            writes.append(data)

    transport.write = lambda data: (note(bytes(data)), write(data))[1]
    transport.writelines = lambda parts: (note(b"".join(parts)), writelines(parts))[1]
    return writes


async def subscribe_and_flush(nc, subject: str) -> list[bytes]:
    """What `nc` writes for a subscribe and the flush right behind it; `nc` closed after."""
    try:
        writes = record_writes(nc)
        await nc.subscribe(subject)
        await nc.flush(timeout=5)
        return writes
    finally:
        await nc.close()


async def test_a_flush_after_a_subscribe_sends_the_sub_before_its_ping(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-flush-order")
    assert await subscribe_and_flush(nc, "test.flush.order") == [b"SUB test.flush.order  1\r\n", b"PING\r\n"]


async def test_a_bare_nats_py_client_sends_the_ping_first(nats_server):
    """The defect worked around (if nats-py fixes it, this fails and the workaround can go)."""
    creds = natsutil.nats_auth.resolve(nats_server.url, None)
    nc = Client()
    await nc.connect(nats_server.url, **(creds.connect_options() if creds else {}))
    assert await subscribe_and_flush(nc, "test.flush.order.bare") == [b"PING\r\n", b"SUB test.flush.order.bare  1\r\n"]


async def test_another_connection_publishing_after_the_flush_is_always_heard(nats_server):
    """The race itself: a subscription, its flush, then a publish from another connection at once.
    Without the workaround about 1 in 100 such messages was dropped here; 300 rounds all heard."""
    a = await natsutil.connect(nats_server.url, "test-flush-order-sub")
    b = await natsutil.connect(nats_server.url, "test-flush-order-pub")
    try:
        heard = 0
        for i in range(300):
            got = asyncio.Event()

            async def on_msg(_msg, got=got) -> None:
                got.set()

            sub = await a.subscribe(f"test.flush.heard.{i}", cb=on_msg)
            await a.flush(timeout=5)
            await b.publish(f"test.flush.heard.{i}", b"x")
            await b.flush(timeout=5)
            try:
                await asyncio.wait_for(got.wait(), 5)
                heard += 1
            except TimeoutError:
                pass
            await sub.unsubscribe()
        assert heard == 300
    finally:
        await a.close()
        await b.close()
