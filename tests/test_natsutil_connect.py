"""natsutil.connect's connection survives an abandoned flush (nats-py's read loop otherwise dies)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from tokenyard.shared import natsutil


async def abandon_a_flush(nc) -> None:
    """A flush whose caller is cancelled after its PING went out, before the PONG is back."""
    task = asyncio.create_task(nc.flush())
    while not nc._pongs:  # its PING is on the way and its future waits for the PONG
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


async def test_a_cancelled_flush_leaves_the_connection_reading(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-abandoned-flush")
    try:
        await abandon_a_flush(nc)
        sub = await nc.subscribe("test.after.abandoned.flush")
        await nc.publish("test.after.abandoned.flush", b"still reading")
        assert (await sub.next_msg(timeout=5)).data == b"still reading"
        await nc.flush(timeout=5)
        assert not nc._reading_task.done()
    finally:
        await nc.close()


async def test_a_bare_nats_py_client_stops_reading_after_one(nats_server):
    """The defect worked around, shown on a plain nats-py client: after the same abandoned
    flush its read loop has ended (if nats-py fixes it, this fails and the workaround can go)."""
    creds = natsutil.nats_auth.resolve(nats_server.url, None)
    nc = Client()
    await nc.connect(nats_server.url, **(creds.connect_options() if creds else {}))
    try:
        await abandon_a_flush(nc)
        async with asyncio.timeout(5):
            while not nc._reading_task.done():
                await asyncio.sleep(0.01)
    finally:
        await nc.close()
