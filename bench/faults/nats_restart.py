"""nats-restart: stop the nats-server for 6 s under load and start it again on the same port
and store. A third of the streams are read raw from their own inbox, a third through
TokenyardClient, a third as OpenAI SSE through the edge; each third is tallied on its own.
Then: when each service answers `$SRV.PING` again (fleet.Answering), and whether new
requests are served."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
from tokenyard.shared import natsutil
from tokenyard.shared.client import TokenyardClient

from bench.faults.fleet import Answering, RestartableNats, fleet_for
from bench.faults.streams import note, submit, submit_via_client, submit_via_http, tally, wait_all

OUTAGE_S = 6.0
"""The outage the issue measured."""
TOKENS = 400


async def probe_nats_restart(args) -> list[dict]:
    server = RestartableNats()
    await server.start()
    fleet = fleet_for(args, nats_url=server.url)
    await fleet.start()
    third = args.restart_streams // 3
    try:
        nc = await natsutil.connect(server.url, "bench-faults")
        client = TokenyardClient(await natsutil.connect(server.url, "bench-faults-client"))
        answering = Answering(nc, fleet.expected())
        await answering.subscribe()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            raw = [await submit(nc, TOKENS, f"probe {i} " * 16) for i in range(third)]
            viewed = [await submit_via_client(client, TOKENS, f"client {i} " * 16) for i in range(third)]
            sse = [await submit_via_http(http, fleet.http_url, TOKENS, f"http {i} " * 16) for i in range(third)]
            async with asyncio.timeout(60):
                await asyncio.gather(*(s.first_chunk.wait() for s in raw + viewed + sse))
            server.stop()
            note(f"nats-restart: server stopped for {OUTAGE_S:g} s")
            await asyncio.sleep(OUTAGE_S)
            await server.start()
            back = await answering.measure()
            note(f"nats-restart: services answer again after {back}")
            await wait_all(raw + viewed + sse, args.deadline_s)
            after = [await submit(nc, 16, f"after {i}") for i in range(20)]
            await wait_all(after, 30)
            rows = [
                tally("nats-restart (raw inbox)", raw, services_back_s=back,
                      new_requests_completed=f"{sum(s.outcome == 'completed' for s in after)}/20"),
                tally("nats-restart (TokenyardClient)", viewed,
                      error_statuses=dict(Counter(s.status for s in viewed if s.terminal == "error"))),
                tally("nats-restart (HTTP SSE via edge)", sse,
                      usage_tokens=dict(Counter(s.usage_tokens for s in sse))),
            ]
        await client.close()
        await client.nc.drain()
        await nc.drain()
        return rows
    finally:
        await fleet.stop()
        server.stop()
