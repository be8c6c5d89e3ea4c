"""With admission in the queue's process, a handed-over request is stored in JetStream once its
route has an answer — the worker's, which leaves with the first token — not as soon as the
offer leaves (services/priority_queue/shell.py `_route`, services/admission/shell.py
`_hand_over`): the store, its ack, its copy's delivery and `accepted` then run after the first
token's messages instead of beside them. The wait is bounded (PLACING_WAIT_S), and only a routed
request waits STORE_AFTER_S more: one that waits for room is stored at once. A raw
subscriber on the queue's stream subject sees when the store's publish arrives."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from tokenyard.services.admission import shell as admission_shell
from tokenyard.services.worker import shell as worker_shell
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.fault_fleet import stop_fleet, worker
from tests.test_queue_with_admission import start


@pytest.mark.parametrize(("answer_after_s", "stored_after"), [(0.03, "the answer"), (0.5, "the bound")])
async def test_the_store_waits_for_the_workers_answer_at_most_placing_wait(nats_server, monkeypatch,
                                                                           answer_after_s, stored_after):
    offers: list[float] = []

    async def late_send(self):  # the worker's answer to the offer comes `answer_after_s` after it
        if self.sent:
            return
        self.sent = True
        offers.append(time.monotonic())
        await asyncio.sleep(answer_after_s)
        await self.req.respond(self.data)

    monkeypatch.setattr(worker_shell.OfferAnswer, "send", late_send)
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 0.0)  # the answer goes at once (then waits above)
    w = worker("sw0")
    fleet = await start(nats_server.url, [w])
    watch = await natsutil.connect(nats_server.url, "store-watch")
    stores: list[float] = []

    async def on_store(msg) -> None:
        stores.append(time.monotonic())

    await watch.subscribe(subjects.QUEUE, cb=on_store)
    await watch.flush()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await client.generate(schemas.GenerateRequest(prompt="store after", max_tokens=2))
        assert done.finish_reason == "length" and done.accepted is not None
        await until(lambda: stores, what="the store's publish")  # heard on another connection
        await watch.flush()  # and no second one on its way
        assert len(offers) == 1 and len(stores) == 1
        waited = stores[0] - offers[0]
        if stored_after == "the answer":
            assert answer_after_s <= waited < 1.0, waited
        else:  # the worker is slower than the bound: stored at the bound, before its answer
            assert admission_shell.PLACING_WAIT_S * 0.9 <= waited < answer_after_s, waited
    finally:
        await client.close()
        await watch.drain()
        await stop_fleet(fleet.hosts)


async def test_a_request_that_waits_for_room_is_stored_at_once_not_after_store_after_s(nats_server, monkeypatch):
    """STORE_AFTER_S lets a routed request's first token go by; one that waits for room has no
    token to let by, and until its store leaves it lives in this process alone (a crash would
    lose it with no event at its client): it is stored, and `accepted`, at once."""
    monkeypatch.setattr(admission_shell, "STORE_AFTER_S", 60.0)  # were it waited, nothing for a minute
    fleet = await start(nats_server.url, [])  # no worker: admitted, it waits in the queue
    fleet.admission.core.cfg.slo_check = False
    watch = await natsutil.connect(nats_server.url, "store-watch")
    stores: list[bytes] = []

    async def on_store(msg) -> None:
        stores.append(msg.data)

    await watch.subscribe(subjects.QUEUE, cb=on_store)
    await watch.flush()
    client = await TokenyardClient.connect(nats_server.url)
    events: list = []

    async def read() -> None:
        async for e in client.stream(schemas.GenerateRequest(prompt="waits for room", max_tokens=2)):
            events.append(e)

    reader = asyncio.create_task(read())
    try:
        await until(lambda: len(stores) == 1 and any(isinstance(e, schemas.Accepted) for e in events),
                    what="stored and accepted while it waits for room")
        assert len(fleet.queue.core) == 1 and not fleet.queue.core.in_flight  # still waiting, not placed
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await client.close()
        await watch.drain()
        await stop_fleet(fleet.hosts)
