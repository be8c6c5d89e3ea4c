"""A worker back from a partition later than the router (services/router/migration.py,
resubscribe_grace_s): its connection's reconnect attempt was in flight to the silent address when
the path healed, and it waits that attempt out (natsutil.ATTEMPT_TIMEOUT_S) — later than
natsutil.IDLE_RECONNECT_BOUND_S, the bound an idle connection keeps. The router, back at once,
must not take the worker's absence meanwhile (no heartbeat, "no responders") for a death and
re-issue its stream to another worker while it runs on: two workers would generate one tail.

Two paths through tests/silent_proxy.py, cut at once: the worker's resets its connection (its
attempts then hang on the silent address), the router's goes silent; both heal while the worker's
attempt is in flight, and the router's old connection meets a reset (it is back at once)."""

from __future__ import annotations

import asyncio

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from tests.conftest import stop_hosts, until
from tests.fault_fleet import TOK, start_streams, worker
from tests.silent_proxy import SilentProxy

TOKENS = 1500
"""~15 s on the a100 profile: the stream runs through the outage and the worker's late return."""


async def test_a_worker_back_later_than_the_router_keeps_its_stream_and_nobody_else_runs_it(plain_nats):
    url = plain_nats.url
    nc = await natsutil.connect(url, "late-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    to_worker, to_router = await SilentProxy(plain_nats.port).start(), await SilentProxy(plain_nats.port).start()
    hosts = [await ServiceHost(worker("lw0"), to_worker.url).start(),
             await ServiceHost(AdmissionShell(AdmissionConfig(), TOK), url).start(),
             await ServiceHost(QueueShell(QueueConfig(), FCFS()), url).start()]
    router = RouterShell(RouterConfig(policy="least-loaded"))
    hosts.append(await ServiceHost(router, to_router.url).start())
    late, tasks, client_nc = hosts[0], [], None
    try:
        await until(lambda: router.core.view.n == 1, what="the router hears lw0")
        client_nc, _, (rec,), tasks = await start_streams(url, 1, TOKENS)  # placed on lw0, the only worker
        hosts.append(await ServiceHost(worker("lw1"), url).start())  # where a re-issue would go
        await until(lambda: router.core.view.n == 2, what="the router hears lw1")
        await to_worker.cut(reset=True)
        await to_router.cut()
        await until(lambda: late.nc.is_connecting, what="lw0's reconnect attempt in flight to the silent address")
        await to_router.heal()
        await to_worker.heal()
        loop = asyncio.get_running_loop()
        healed = loop.time()
        await until(lambda: late.nc.is_connected, timeout_s=natsutil.ATTEMPT_TIMEOUT_S + 3, poll_s=0.05,
                    what="lw0 back once its attempt gave up")
        back_after = loop.time() - healed
        assert router.nc.stats["reconnects"] == 1  # the router was back first
        assert natsutil.IDLE_RECONNECT_BOUND_S < back_after <= natsutil.RECONNECT_BOUND_S, back_after
        async with asyncio.timeout(60):
            await tasks[0]
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == TOKENS, rec.last
        assert rec.seqs() == list(range(len(rec.seqs())))  # one stream: no seq twice, none missing
        assert router.migration.migrated == 0  # not re-issued to lw1 while lw0 ran on
        # the first chunk each worker sends names it: lw0's alone came
        assert [e.worker_id for e in rec.events if isinstance(e, schemas.Chunk) and e.worker_id] == ["lw0"]
    finally:
        for t in tasks:
            t.cancel()
        if client_nc is not None:
            await client_nc.close()
        await stop_hosts(hosts)
        await to_worker.stop()
        await to_router.stop()
