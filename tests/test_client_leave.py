"""A TokenyardClient reader that leaves a stream before its end by a `break` out of its
`async for` aborts the request, as a cancelled reader does: the chaos probe (bench.faults
--probe chaos) found on main every such request still generating on its worker 3 s later,
for nobody. On a real nats-server, admission, queue and router in one process, a simulated
A100 worker (a 2,000-token answer takes it ~20 s)."""

from __future__ import annotations

import asyncio

import msgspec
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.fault_fleet import stop_fleet, worker
from tests.test_queue_with_admission import start


async def running(nc, wid: str) -> set[str]:
    msg = await nc.request(subjects.worker_status(wid), b"", timeout=2)
    return set(msgspec.msgpack.decode(msg.data, type=list[str]))


async def _read(client: TokenyardClient, rid: str, leave: str) -> int:
    request = schemas.GenerateRequest(prompt="leave me", max_tokens=2000, ignore_eos=True, request_id=rid)
    chunks = 0
    async for event in client.stream(request):
        chunks += isinstance(event, schemas.Chunk)
        if chunks == 3:
            if leave == "break":
                break
            await asyncio.sleep(30)  # cancelled here
    return chunks


async def test_a_reader_that_breaks_out_of_its_stream_stops_the_request_on_its_worker(nats_server):
    fleet = await start(nats_server.url, [worker("lv0")])
    client = await TokenyardClient.connect(nats_server.url)
    operator = await natsutil.connect(nats_server.url, "client-leave-check")  # a client may not ask a worker
    try:
        assert await _read(client, "left-by-break", "break") == 3
        # main: still generating ~20 s on; the client's lease lives, so no router calls it an orphan
        await until(lambda: _gone(operator, "left-by-break"), timeout_s=2, what="the worker stops it")
        reader = asyncio.create_task(_read(client, "left-by-cancel", "cancel"))
        await until(lambda: _running(operator, "left-by-cancel"), timeout_s=10, what="it runs")
        await asyncio.sleep(0.2)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await until(lambda: _gone(operator, "left-by-cancel"), timeout_s=2, what="the worker stops it")
    finally:
        await operator.drain()
        await client.close()
        await stop_fleet(fleet.hosts)


async def _running(nc, rid: str) -> bool:
    return rid in await running(nc, "lv0")


async def _gone(nc, rid: str) -> bool:
    return not await _running(nc, rid)
