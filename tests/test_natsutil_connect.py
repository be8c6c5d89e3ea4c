"""natsutil.connect's connection survives an abandoned flush (nats-py's read loop otherwise dies)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from tokenyard.shared import natsutil

from tests.conftest import until


async def abandon_a_flush(nc) -> None:
    """A flush whose caller is cancelled after its PING went out, before the PONG is back. (The
    nats-py defect these tests pin lives in its private state, `_pongs` and `_reading_task`:
    nats-py has no public view of either.)"""
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


class Partition:
    """A TCP proxy in front of nats-server that can go silent (forwards nothing and closes
    nothing: a partition, or a host gone without a FIN) and heal; a connection from before
    the heal is then reset at the next byte its client sends, as the host of a restarted
    server answers a connection it no longer knows."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.silent = False
        self.epoch = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return f"nats://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def heal(self) -> None:
        self.silent, self.epoch = False, self.epoch + 1

    async def _connection(self, reader, writer) -> None:
        epoch = self.epoch
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src, dst, from_client: bool) -> None:
            while data := await src.read(65536):
                if from_client and self.epoch != epoch:
                    writer.transport.abort()
                    break
                if not self.silent and self.epoch == epoch:
                    dst.write(data)
            up_writer.close()
            writer.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True)

    async def stop(self) -> None:
        self.server.close()


async def test_an_idle_connection_reconnects_within_the_bound_after_a_silent_outage(nats_server):
    """The server goes silent for 3 s without closing the connection, then answers again on
    the same address (resetting the old connection): an idle client, which writes nothing of
    its own, is reconnected within natsutil.IDLE_RECONNECT_BOUND_S (its next PING meets the reset;
    with nats-py's default 120 s ping interval it stayed deaf for up to two minutes)."""
    partition = Partition(int(nats_server.url.rsplit(":", 1)[1]))
    url = await partition.start()
    creds = natsutil.nats_auth.resolve(nats_server.url, None)
    nc = await natsutil.connect(url, "test-partition", creds=creds)
    try:
        sub = await nc.subscribe("test.after.partition")
        partition.silent = True
        await asyncio.sleep(3.0)  # the outage itself: no event to await, time is what it is
        partition.heal()
        healed = asyncio.get_running_loop().time()
        await until(lambda: nc.stats["reconnects"] == 1 and nc.is_connected, timeout_s=natsutil.IDLE_RECONNECT_BOUND_S)
        assert asyncio.get_running_loop().time() - healed < natsutil.IDLE_RECONNECT_BOUND_S
        assert natsutil.IDLE_RECONNECT_BOUND_S < 5.0  # the bound, with margin
        await nc.publish("test.after.partition", b"heard")
        assert (await sub.next_msg(timeout=5)).data == b"heard"
    finally:
        await nc.close()
        await partition.stop()


def test_reconnected_at_is_none_while_a_counted_reconnect_has_not_called_back():
    """Review of round 9: nats-py counts a reconnect, flushes, then calls back; read in between,
    the kept time was the previous reconnect's, and clocks restarted from a moment long past."""
    class Conn:
        stats = {"reconnects": 1}

    nc = Conn()
    assert natsutil.reconnected_at(nc) is None  # never came back
    natsutil.note_reconnected(nc, 100.0)  # the callback of the first
    assert natsutil.reconnected_at(nc) == 100.0
    nc.stats = {"reconnects": 2}  # the second reconnect, counted, its callback still to come
    assert natsutil.reconnected_at(nc) is None
    natsutil.note_reconnected(nc, 250.0)
    assert natsutil.reconnected_at(nc) == 250.0
