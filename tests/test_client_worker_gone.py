"""A stream whose placing router and then its worker die inside the hand-over window (the worker
hands a dead router's streams over only 3-9 s after the death, services/worker/leases.py) is
known to nobody alive but its client. TokenyardClient ends it with a clear 503 once two probes
of the worker's `alive` subject found no responders and no router moved it within the routers'
re-issue deadline (shared/stream_watch.py), not with silence until its 60 s idle timeout.
Live, on a nats-server of its own: two workers, admission, the queue, router A (which places
every stream), router B (alive, knows none of them)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import client as client_mod
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import IDLE_TIMEOUT_S
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.stream_watch import StreamWatch

from tests.conftest import stop_hosts, until
from tests.fault_fleet import crash_worker, start_fleet, start_streams, stop_fleet

GRACE_S = 2.0
"""The routers' re-issue deadline the client waits after the proof (10 s in production):
shortened here, the rule is the same."""


async def test_a_stream_whose_router_then_worker_died_ends_with_a_503_not_silence(monkeypatch):
    monkeypatch.setattr(client_mod, "StreamWatch", functools.partial(StreamWatch, grace_s=GRACE_S))
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url)
    router_b = None
    try:
        router_a = hosts[-1]
        nc, client, recs, tasks = await start_streams(server.url, 8, 3000)
        router_b = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start()
        await until(lambda: router_b.shell.core.view.n >= 2, what="router B hears both workers")
        victim = hosts[0]
        lost = set(victim.shell.core.running_ids())
        assert lost and lost != {r.events[0].request_id for r in recs}, "streams on both workers"
        named = [e.worker_id for r in recs for e in r.events if isinstance(e, schemas.Chunk) and e.worker_id]
        assert sorted(set(named)) == ["fw0", "fw1"] and len(named) == len(recs)  # each first chunk names one
        router_a._stopped.set()  # router A dies as a SIGKILL would: its connection goes
        await router_a.nc.close()
        t0 = time.monotonic()
        await crash_worker(victim)  # at once: far inside the window
        async with asyncio.timeout(IDLE_TIMEOUT_S):
            await until(lambda: all(r.events and isinstance(r.last, schemas.TERMINAL_EVENTS)
                                    for r in recs if r.events[0].request_id in lost), IDLE_TIMEOUT_S, 0.05,
                        what="the lost streams to end")
        for rec in recs:
            if rec.events[0].request_id not in lost:
                continue
            end = rec.last
            assert isinstance(end, schemas.Error) and end.status == 503, end
            assert end.message == "worker fw0 is gone and no router moved the stream", end.message
            assert end.seq == len(rec.seqs()) and rec.seqs() == list(range(len(rec.seqs())))
            # two probes FLOOR_S apart after a FLOOR_S silence, then the grace: ~8 s, not the idle 60 s
            assert 6.0 + GRACE_S <= rec.end_s - t0 < IDLE_TIMEOUT_S / 2, rec.end_s - t0
        for t in tasks:  # the streams on fw1 run on (router B adopts them); they are not this test's
            t.cancel()
        await client.close()
    finally:
        with contextlib.suppress(Exception):
            await stop_hosts([hosts[-1]])  # router A: its connection is gone, what is left of it stops
        if router_b is not None:
            await stop_hosts([router_b])
        await stop_fleet(hosts[:-1])
        server.stop()
