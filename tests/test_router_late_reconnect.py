"""The router's migration tick sleeps while it follows no stream; a NATS outage that begins and
ends then is found, when a stream is next followed, by the connection's reconnect count. Its
clocks restart from the reconnect (natsutil.reconnected_at), not from that late moment: a
client that vanished before the outage is found gone as soon as its request is followed, on a
real nats-server stopped and started again. Main restarted them late: the lease of the gone
client counted as heard when the stream was followed, and its orphan ran on for another
`orphan_after_s`."""

from __future__ import annotations

import asyncio
import time
import uuid

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from bench.faults.fleet import RestartableNats
from tests.builders import hb, req
from tests.conftest import until

LATE_S = 4.0
"""The stream comes this long after the reconnect: past the lease's orphan_after_s (3 s)."""


async def test_a_reconnect_slept_through_restarts_the_clocks_from_the_reconnect_not_from_the_next_stream():
    server = RestartableNats()
    await server.start()
    cfg = MigrationConfig()
    host = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded"), migration=cfg), server.url).start()
    nc = await natsutil.connect(server.url, "late-reconnect")
    aborts: list[tuple[float, schemas.Abort]] = []

    async def offered(msg) -> None:  # a worker that takes every request
        ar = codec.decode(msg.data, schemas.AdmittedRequestInTransit)
        await msg.respond(codec.encode(schemas.GenerateReply(ar.request_id, True)))

    async def on_abort(msg) -> None:
        aborts.append((time.monotonic(), codec.decode(msg.data, schemas.Abort)))

    async def beat() -> None:
        while True:
            if nc.is_connected:
                await nc.publish(subjects.heartbeat("lw0"), codec.encode(hb("lw0", ts=time.time())))
            await asyncio.sleep(0.1)

    beats = asyncio.create_task(beat())
    try:
        await nc.subscribe(subjects.worker_generate("lw0"), cb=offered)
        await nc.subscribe(subjects.ABORT, cb=on_abort)
        lease = uuid.uuid4().hex[:16]
        await nc.publish(subjects.lease(lease), b"")  # heard once; then its client is gone
        await until(lambda: lease in host.shell.migration.leases and "lw0" in host.shell.core.view.ids,
                    what="the router hears the lease and the worker")
        assert not host.shell.migration.tracked  # its tick sleeps
        server.stop()
        await asyncio.sleep(0.5)
        await server.start()
        await until(lambda: natsutil.reconnected_at(host.nc) is not None and nc.is_connected, timeout_s=15,
                    what="both connections back")
        await nc.flush()  # the worker's subscriptions, sent again on its reconnect, are the server's
        await asyncio.sleep(LATE_S)  # the reconnect slept through: what this test is about
        ar = req("orphan", prompt_len=16, reply_to=f"_INBOX.{lease}.1", model="m")
        decision = await host.shell.route(ar)
        assert decision.outcome == schemas.Outcome.ROUTED and decision.worker_id == "lw0"
        followed = time.monotonic()
        await until(lambda: any(a.request_id == "orphan" for _, a in aborts), timeout_s=8, what="the orphan's abort")
        took = next(t for t, a in aborts if a.request_id == "orphan") - followed
        assert [a.reason for _, a in aborts if a.request_id == "orphan"] == ["orphaned"]
        assert took < cfg.orphan_after_s / 2, took  # main: ≥ orphan_after_s (3 s) after it was followed
    finally:
        beats.cancel()
        await nc.drain()
        await host.stop()
        server.stop()
