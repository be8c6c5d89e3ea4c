"""A request whose placing router died is migrated all the same when its worker dies later
(shared/adoption.py). Live, on the session's secured nats-server: two workers and router A; a
NATS client (no lease) has A place a long stream; router B starts; A's connection closes (a
SIGKILL's effect on the bus). The worker finds A gone and hands the stream to B, which
follows it from the worker's state. Then the worker's connection closes: B re-issues the
request to the other worker with the tokens sent, and the client's one stream completes with
every seq once, no gap, the full token count."""

from __future__ import annotations

import contextlib

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req
from tests.conftest import InProcFleet, stop_hosts, until

TOKENS = 1500


async def test_a_dead_routers_stream_is_adopted_and_migrated_when_its_worker_dies(nats_server):
    fleet = InProcFleet(nats_server.url, None)
    workers = []
    for i in range(2):
        engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=1.0)
        workers.append(await fleet.add(WorkerShell(WorkerConfig(f"aw{i}", config.DEFAULT_MODEL), engine,
                                                   ByteTokenizer())))
    router_a = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
    router_b = None
    nc = await natsutil.connect(nats_server.url, "adoption-client")
    got: list[schemas.StreamEvent] = []

    async def on_event(msg):
        got.append(codec.decode_event(msg.data, msg.headers))

    await nc.subscribe("_INBOX.adoptclient.1", cb=on_event)
    ar = req("adopt-1", prompt_len=64, max_tokens=TOKENS, reply_to="_INBOX.adoptclient.1", model=config.DEFAULT_MODEL)
    try:
        await until(lambda: {"aw0", "aw1"} <= set(router_a.shell.core.view.ids), 10, what="router A hears both")
        decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=10)).data,
                                schemas.RouteDecision)
        assert decision.outcome == schemas.Outcome.ROUTED, decision
        host = next(w for w in workers if w.shell.core.cfg.worker_id == decision.worker_id)
        await until(lambda: got, 20, what="the first chunk")
        router_b = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
        await until(lambda: {"aw0", "aw1"} <= set(router_b.shell.core.view.ids), 10, what="router B hears both")
        await router_a.nc.close()  # router A is gone from the bus, its streams' follower with it
        await until(lambda: "adopt-1" in router_b.shell.migration.tracked, 30, 0.05,
                    what="the worker hands the stream to router B")
        assert router_b.shell.migration.tracked["adopt-1"].worker_id == decision.worker_id
        await host.nc.close()  # the worker dies mid-stream
        await until(lambda: any(isinstance(e, schemas.TERMINAL_EVENTS) for e in got), 60, 0.05,
                    what="the stream to end")
        assert router_b.shell.migration.migrated == 1
        chunks = [e for e in got if isinstance(e, schemas.Chunk)]
        assert [c.seq for c in chunks] == list(range(len(chunks)))  # every seq once, in order
        assert sum(len(c.token_ids) for c in chunks) == TOKENS
        assert isinstance(got[-1], schemas.Finished) and got[-1].usage.completion_tokens == TOKENS, got[-1]
    finally:
        with contextlib.suppress(Exception):
            await nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id)))
            await nc.flush()
        for w in workers:  # the dead worker's engine still runs the stream: stop it there
            await w.shell.engine.abort(ar.request_id)
        dead = [h for h in (router_a, *workers) if h.nc.is_closed]
        with contextlib.suppress(Exception):  # their connection is gone: what is left of them stops
            await stop_hosts(dead)
        await stop_hosts([h for h in fleet.hosts if h not in dead])
        await nc.close()
