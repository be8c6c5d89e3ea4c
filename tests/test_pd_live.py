"""Spatial P/D live over a real nats-server with the simulated engine (issue 13): a
macro-instance in mode `pd`; a request is prefilled on a prefill worker, which streams its
first token and sends the decode leg to the router; a decode worker receives the KV (after
its transfer time) and streams the rest to the same client, numbered on."""

from __future__ import annotations

import asyncio

from tokenyard.services.macro_instance.core import MacroConfig
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import InProcFleet, start_macro_fleet, until

WORKERS = ("pw0", "pw1", "pw2", "pw3")


async def start_pd_fleet(url: str) -> InProcFleet:
    """4 workers under one spatial P/D macro-instance (half prefill, half decode)."""
    return await start_macro_fleet(url, WORKERS, MacroConfig(size=4, mode="pd"))


async def test_a_request_is_prefilled_on_a_prefill_worker_and_decoded_on_a_decode_worker(nats_server):
    fleet = await start_pd_fleet(nats_server.url)
    cores = {h.shell.core.cfg.worker_id: h.shell.core for h in fleet.workers}
    offers: list[tuple[str, str, bool, bool]] = []  # (request, worker, a decode leg, accepted)
    for wid, core in cores.items():

        def offer(req, stats, prefill=None, *, wid=wid, inner=core.offer):
            reply, start = inner(req, stats, prefill)
            offers.append((req.request_id, wid, bool(req.kv_from), reply.accepted))
            return reply, start

        core.offer = offer
    planned = asyncio.Event()

    async def on_state(msg) -> None:
        s = codec.decode(msg.data, schemas.MacroState)
        if s.mode == "pd" and set(s.workers) == set(WORKERS):
            planned.set()

    await fleet.nats.subscribe(subjects.MACRO_STATE_ALL, cb=on_state)
    try:
        async with asyncio.timeout(30):
            await planned.wait()
        await until(lambda: all(c.mode == "pd" and c.phase != "mixed" for c in cores.values()),
                    timeout_s=30)  # every worker has its control
        prefill = {w for w, c in cores.items() if c.phase == "prefill"}
        decode = set(WORKERS) - prefill
        assert (len(prefill), len(decode)) == (2, 2)
        client = TokenyardClient(fleet.nats)
        events = []
        async with asyncio.timeout(30):
            async for ev in client.stream(schemas.GenerateRequest(prompt="x" * 600, max_tokens=8)):
                events.append(ev)
        chunks = [e for e in events if isinstance(e, schemas.Chunk)]
        done = events[-1]
        assert isinstance(done, schemas.Finished), events
        assert [c.seq for c in chunks] == list(range(8)) and done.seq == 8
        assert done.finish_reason == "length" and done.usage.completion_tokens == 8
        assert done.worker_id in decode
        accepted = [(w, leg) for rid, w, leg, ok in offers if ok and rid == done.request_id]
        assert len(accepted) == 2
        assert accepted[0][0] in prefill and not accepted[0][1]  # the new request: a prefill worker
        assert accepted[1] == (done.worker_id, True)  # the decode leg: the decode worker
        assert all(not c.streams for c in cores.values())  # nobody holds a stream
    finally:
        await fleet.stop()
        await fleet.nats.drain()
