"""Where tokenyard reaches into nats-py's internals, each guarded: a nats-py without the
attribute leaves the behaviour to nats-py, as before. Two mend nats-py (`skip_abandoned_pongs`: a
cancelled flush stops the reader; `ping_after_pending`: a flush's PING overtakes the SUBs still
pending), three take turns of the loop off the first token's path (`deliver_directly`,
`handle_directly`: a message handled in the reader's own turn; `send_now`: the pending buffer
written now, not on the flusher's turn). `natsutil.connect` gives every connection the mends."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from tokenyard.shared import telemetry
from tokenyard.shared.eager import eager_task

log = telemetry.logger("nats")


def skip_abandoned_pongs(nc: Client) -> None:
    """nats-py answers each PONG by setting the result of the oldest waiting flush() future. A
    flush whose caller was cancelled or timed out leaves its future cancelled in that list; the
    PONG that answers it then raises InvalidStateError inside the read loop, which stops reading
    for good: the connection looks up and receives nothing until the stale-ping check, minutes
    later (the same family as nats-io/nats.py#624). Here an abandoned future takes its PONG and
    nothing else happens."""

    async def process_pong() -> None:
        if nc._pongs:
            future = nc._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            nc._pongs_received += 1
            nc._pings_outstanding = 0

    nc._process_pong = process_pong


def ping_after_pending(nc: Client) -> None:
    """nats-py's flush() writes its PING straight to the socket, ahead of what still waits in the
    pending buffer for the flusher's turn: right after a subscribe the PONG could come back before
    the server had read the SUB, and a message another connection then published was dropped
    (about 1 % of such rounds on this machine). Here the buffer is written first (send_now), so a
    flush that returns means the server has processed everything sent before it, SUBs included.
    `connect` does this to every connection; a bare nats-py one may be given it too."""
    send_ping = nc._send_ping

    async def in_order(future=None) -> None:
        send_now(nc)
        await send_ping(future)

    nc._send_ping = in_order


class _Direct(asyncio.Queue):
    """A subscription's pending queue that is never pending: nats-py's reader puts each message
    here, and it goes to `deliver` there and then (so `get` waits for ever: the subscription's
    own task sleeps until its unsubscribe cancels it)."""

    def __init__(self, sub, deliver) -> None:
        super().__init__()
        self._sub, self._deliver = sub, deliver

    def put_nowait(self, msg) -> None:
        self._sub._pending_size -= len(msg.data)  # nats-py counted it in
        try:
            self._deliver(msg)
        except Exception:  # raised into nats-py's reader, it would stop the connection's reading
            log.exception("a message's delivery failed", subject=msg.subject)


def deliver_directly(sub, deliver) -> bool:
    """Have nats-py's reader call `deliver(msg)` (plain and quick; an error is logged) for each message
    of `sub` as it parses it, instead of queueing it for the subscription's task, which costs a
    wake-up of that task per message. Whether it could (a nats-py without the attribute keeps
    delivering through the subscription's own callback, which must do the same)."""
    if not isinstance(getattr(sub, "_pending_queue", None), asyncio.Queue):
        return False
    sub._pending_queue = _Direct(sub, deliver)
    return True


def handle_directly(service, subject: str) -> bool:
    """Have the nats.micro endpoint on `subject` start its handler for each request in nats-py's
    reader's turn, as an eager task (shared/eager.py: it runs up to its first real wait there
    and then), instead of queueing the request for the endpoint's subscription task — one turn
    of the loop fewer before the handler runs (the worker's offers: on the first token's path).
    nats.micro's own wrapper still runs each request, so the endpoint's stats (`$SRV.STATS`)
    count it as before. Whether it could (a nats.micro without these attributes keeps its
    subscription's task)."""
    endpoint = next((e for e in getattr(service, "_endpoints", []) if getattr(e, "_subject", None) == subject), None)
    handle = getattr(endpoint, "_handle_request", None)
    if handle is None or getattr(endpoint, "_subscription", None) is None:
        return False
    running: set[asyncio.Task] = set()  # each handler's task, held until it ends

    def start(msg) -> None:
        task = eager_task(handle(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    return deliver_directly(endpoint._subscription, start)


def send_now(nc) -> bool:
    """Write what the connection holds for the server now, in this turn of the loop. nats-py
    queues each publish in a pending buffer and writes it from its flusher task on a later turn,
    after whatever else the loop has ready (on the first token's way, in the queue's process:
    the hand-over, the edge's set-up, the rest of the call that made the offer — ~0.1 ms). This
    is what nats-py does itself when its flusher is gone: the pending buffer in one
    `writelines`, emptied; the flusher, when it runs, finds nothing left to write. Whether it
    wrote (not while disconnected — a reconnect sends the buffer — nor on a transport that
    refuses the write, nor on a nats-py without these attributes: each leaves it to its
    flusher, as before)."""
    pending, transport = getattr(nc, "_pending", None), getattr(nc, "_transport", None)
    if not isinstance(pending, list) or not pending or transport is None or not nc.is_connected:
        return False
    try:
        transport.writelines(pending[:])
    except (OSError, RuntimeError):  # a transport closing under us refuses before writing anything:
        return False  # the buffer stays for nats-py's flusher, which meets the error and reconnects
    nc._pending = []
    nc._pending_data_size = 0
    return True
