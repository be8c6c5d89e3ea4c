"""With admission, the queue and the router in one process (`tokenyard up`'s default), the
call that hands a request to the queue (QueueShell.take) reaches the router's offer to a
worker before it returns, and the offer is written to the socket in that call
(nats_internals.send_now), not on nats-py's flusher's turn behind the rest of the caller's work:
on return the stream is followed, the placement is under way and nothing is left unwritten.
The request then runs as any other. Against a real nats-server."""

from __future__ import annotations

import time
import uuid

from tokenyard.services.router.reask import key_of
from tokenyard.shared import codec, config, nats_internals, natsutil, schemas

from tests.builders import req
from tests.conftest import until
from tests.fault_fleet import stop_fleet, worker
from tests.test_queue_with_admission import start


async def test_take_makes_and_writes_the_offer_before_it_returns(nats_server):
    fleet = await start(nats_server.url, [worker("tw0"), worker("tw1")])
    nc = await natsutil.connect(nats_server.url, "offer-in-take-client")
    events: list[schemas.StreamEvent] = []

    async def on_event(msg) -> None:
        events.append(codec.decode_event(msg.data, msg.headers))

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=on_event)
    await nc.flush()
    try:
        rid = uuid.uuid4().hex
        ar = req(rid, tokens=list(range(40)), max_tokens=3, reply_to=inbox, model=config.DEFAULT_MODEL,
                 arrival_s=time.time())
        placing = fleet.queue.take(ar, codec.encode(ar), {})
        # nothing awaited since the call: what follows happened inside it
        assert placing is not None and not placing.done()
        assert rid in fleet.router.following  # subscribed to the stream before the offer
        assert key_of(ar) in fleet.router.reask.placing  # the placement is under way
        assert fleet.router.nc.pending_data_size == 0  # the subscription and the offer are on the wire
        await placing  # the worker answered
        await until(lambda: events and isinstance(events[-1], schemas.TERMINAL_EVENTS), what="the stream's end")
        assert isinstance(events[-1], schemas.Finished) and events[-1].usage.completion_tokens == 3
        assert [k[0] for k in fleet.router.reask.placed] == [rid]
        assert fleet.queue.kept() == {"local": 0, "stored": 0, "placing": 0, "routes": 0, "held": 0, "waiting": 0,
                                      "in_flight": 0, "received_ns": 0}
    finally:
        await nc.drain()
        await stop_fleet(fleet.hosts)


def test_send_now_leaves_the_buffer_to_the_flusher_when_the_transport_refuses():
    """A connection whose transport is closing under it (a NATS node killed mid-stream): the
    write raises in the caller — a worker's generation, a router's offer — without it, and the
    buffer stays whole for nats-py's flusher, which meets the error and reconnects."""

    class Closing:
        def writelines(self, data) -> None:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    class Conn:
        is_connected = True
        _transport = Closing()

        def __init__(self) -> None:
            self._pending, self._pending_data_size = [b"PUB a 1\r\nx\r\n"], 14

    conn = Conn()
    assert nats_internals.send_now(conn) is False
    assert conn._pending == [b"PUB a 1\r\nx\r\n"] and conn._pending_data_size == 14


async def test_send_now_writes_what_is_pending_once(nats_server):
    pub = await natsutil.connect(nats_server.url, "send-now-pub")
    sub = await natsutil.connect(nats_server.url, "send-now-sub")
    got = []

    async def on_msg(msg) -> None:
        got.append(msg.data)

    try:
        await sub.subscribe("send.now.test", cb=on_msg)
        await sub.flush()
        assert nats_internals.send_now(pub) is False  # nothing pending: nothing written
        await pub.publish("send.now.test", b"one")
        assert pub.pending_data_size > 0
        assert nats_internals.send_now(pub) is True and pub.pending_data_size == 0
        await pub.flush()  # the flusher's turn: nothing left, nothing sent twice
        await until(lambda: got, what="the message")
        await sub.flush()
        assert got == [b"one"]
    finally:
        await pub.drain()
        await sub.drain()
