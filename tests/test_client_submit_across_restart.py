"""A submit sent while the nats-server restarts (shared/client.py `stream_batches`): nats-py sends
it as soon as the connection is back, before admission has resubscribed, so "no responders"
answers it. The retry window (`no_responders_retry_s`) then starts again: the one that ran out
while the bus was down tried nothing, and admission, which was running all along, is reached
once it is back, instead of the client answering 503 "no admission service is running"
(bench.faults chaos, seeds 4-8 on main: 3-5 NATS requests a run, sent in the outage).

Real nats-server, stopped and started on its port; admission is a plain subscription on
`llm.v1.submit` of this module's own server that answers every submit with a 429 naming
itself, subscribed only once the client's submit has met "no responders" after the restart (its
connection is made before, so the subscribe alone, ~1 ms, falls within the 2 s window)."""

from __future__ import annotations

import asyncio

from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until


class _SeesNoResponders(TokenyardClient):
    """Sets `no_responders` when a "no responders" status reaches one of its inboxes."""

    def __init__(self, nc) -> None:
        super().__init__(nc)
        self.no_responders = asyncio.Event()

    def _deliver(self, msg) -> None:
        if not msg.data and msg.headers and msg.headers.get("Status") == "503":
            self.no_responders.set()
        super()._deliver(msg)


async def test_a_submit_sent_in_a_bus_outage_reaches_admission_once_it_resubscribes():
    server = await natsutil.NatsServer().start()
    admission = None
    try:
        client = _SeesNoResponders(await natsutil.connect(server.url, "client"))
        first = await client.generate(schemas.GenerateRequest(prompt="before", max_tokens=2))  # the inbox is up
        assert first.rejected is not None and first.rejected.status == 503  # no admission yet: refused

        server.stop()
        await until(lambda: not client.nc.is_connected, what="the client saw the server go")
        client.no_responders.clear()
        req = schemas.GenerateRequest(prompt="in the outage", max_tokens=2, request_id="r1")
        result = asyncio.create_task(client.generate(req))
        await asyncio.sleep(2.5)  # the outage outlasts the 2 s retry window: it is the case itself
        await server.start()
        admission = await natsutil.connect(server.url, "admission")  # connected now: only its subscribe is left
        await asyncio.wait_for(client.no_responders.wait(), 10)  # the buffered submit met nobody

        async def answer(msg) -> None:
            rid = codec.decode(msg.data, schemas.GenerateRequest).request_id
            await admission.publish(msg.reply, codec.encode(schemas.Rejected(rid, 429, "heard", "admission heard it")))

        await admission.subscribe(subjects.SUBMIT, cb=answer)
        await admission.flush()
        out = await asyncio.wait_for(result, 10)
        assert out.rejected is not None
        assert (out.rejected.status, out.rejected.message) == (429, "admission heard it")
        await client.close()
        await client.nc.drain()
    finally:
        if admission is not None:
            await admission.close()
        server.stop()
