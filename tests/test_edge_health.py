"""The edge's `/health` (readiness: NATS, an admission answering, a worker up by admission's
count, else a 503 naming why) and `/live` (the process), for an edge process of its own, which
asks admission on `llm.v1.admission.health` once however many probes come. The edge in the
queue's process is tests/test_edge_in_queue.py's."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from tokenyard.services.edge.health import HealthProbe
from tokenyard.shared import codec, natsutil, schemas, subjects

from tests.conftest import until
from tests.test_edge_http import FakeAdmission, health, start_edge


async def test_probes_that_come_while_an_ask_is_out_share_its_answer():
    """A probe storm costs admission one request per round trip, not one per probe."""
    server = await natsutil.NatsServer().start()  # of its own: the module's fake admission answers too
    nc = await natsutil.connect(server.url, "slow-admission")
    asks: list = []
    release = asyncio.Event()

    async def on_health(msg) -> None:
        asks.append(msg)
        await release.wait()
        await msg.respond(codec.encode(schemas.FleetHealth(workers_up=3, workers_known=3)))

    sub = await nc.subscribe(subjects.ADMISSION_HEALTH, cb=on_health)
    probe_nc = await natsutil.connect(server.url, "probe")
    try:
        probe = HealthProbe(probe_nc)
        probes = [asyncio.ensure_future(probe.readiness()) for _ in range(10)]
        await until(lambda: len(asks) == 1, what="the first ask arrives")
        release.set()
        verdicts = await asyncio.gather(*probes)
        assert [v.status for v in verdicts] == [200] * 10 and len(asks) == 1
        assert (await probe.readiness()).body["workers_up"] == 3 and len(asks) == 2  # the next round asks anew
    finally:
        await sub.unsubscribe()
        await probe_nc.close()
        await nc.close()
        server.stop()


async def test_health_is_readiness_with_its_reason_and_live_is_the_process():
    """An edge process of its own: /health is 200 only while it can serve — NATS connected, an
    admission answering, a worker up by admission's count — else a 503 naming why; /live is 200
    while the process answers, whatever the fleet. Before, /health said ok with NATS alone."""
    server = await natsutil.NatsServer().start()
    host = await start_edge(server.url)
    url = f"http://127.0.0.1:{host.shell.port}"
    nc = await natsutil.connect(server.url, "fake-admission-health")
    try:
        status, body = await health(url)  # nothing answers on llm.v1.admission.health
        assert (status, body["status"], body["reason"]) == (503, "unavailable", "admission_unavailable")
        assert subjects.ADMISSION_HEALTH in body["message"]
        fake = await FakeAdmission(nc, workers_up=0).start()
        status, body = await health(url)
        assert (status, body["reason"], body["workers_up"], body["workers_known"]) == (503, "no_workers", 0, 1)
        fake.fleet = schemas.FleetHealth(workers_up=0, workers_known=2, observing=False)
        assert (await health(url))[1]["reason"] == "admission_disconnected"
        fake.fleet = schemas.FleetHealth(workers_up=2, workers_known=2)
        assert await health(url) == (200, {"status": "ok", "workers_up": 2, "workers_known": 2})
        server.stop()
        await until(lambda: host.shell.health is not None and not host.shell.health.nc.is_connected,
                    what="the edge sees its connection go")
        status, body = await health(url)
        assert (status, body["reason"]) == (503, "nats_disconnected")
        async with aiohttp.ClientSession() as s, s.get(f"{url}/live") as r:
            assert (r.status, await r.json()) == (200, {"status": "live"})
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        await host.stop()
        server.stop()
