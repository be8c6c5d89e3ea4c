"""The setting of the live adoption tests: one simulated worker, router A that places long
streams on it, and a client that counts each stream's events and records every hand-over
(AdoptAsk) on the bus. `place` routes the streams through A and waits for each first chunk;
`stop` aborts them and stops every host, those whose connection a test closed included."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from nats.aio.client import Client
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import InProcFleet, stop_hosts, until


@dataclass
class AdoptionFleet:
    fleet: InProcFleet
    worker: object
    router_a: object
    nc: Client
    """The client: it routes the streams and reads them."""
    got: dict[str, int] = field(default_factory=dict)
    """request id → events its client got."""
    asks: list[bytes] = field(default_factory=list)
    """Every AdoptAsk seen on the bus, as sent."""


def router() -> RouterShell:
    return RouterShell(RouterConfig(policy="least-loaded"))


async def start(url: str, worker_id: str, inbox: str) -> AdoptionFleet:
    """The worker, router A and the client, whose streams' reply subjects are `inbox`.*."""
    fleet = InProcFleet(url, None)
    engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=0.25)
    worker = await fleet.add(WorkerShell(WorkerConfig(worker_id, config.DEFAULT_MODEL, flow_control=False), engine,
                                         ByteTokenizer()))
    af = AdoptionFleet(fleet, worker, await fleet.add(router()), await natsutil.connect(url, f"{worker_id}-client"))

    async def on_ask(msg):
        af.asks.append(msg.data)

    async def on_event(msg):
        rid = codec.decode_event(msg.data, msg.headers).request_id
        af.got[rid] = af.got.get(rid, 0) + 1

    await af.nc.subscribe(subjects.ADOPT, cb=on_ask)
    await af.nc.subscribe(f"{inbox}.*", cb=on_event)
    await af.nc.flush()
    return af


async def place(af: AdoptionFleet, reqs: list[AdmittedRequest], first_chunk_s: float) -> None:
    """Route every request through router A (each routed), then wait for each one's first chunk."""
    wid = af.worker.shell.core.cfg.worker_id
    await until(lambda: wid in af.router_a.shell.core.view.ids, 10, what="router A hears the worker")
    for ar in reqs:
        decision = codec.decode((await af.nc.request(subjects.ROUTE, codec.encode(ar), timeout=10)).data,
                                schemas.RouteDecision)
        assert decision.outcome == schemas.Outcome.ROUTED, decision
    await until(lambda: len(af.got) == len(reqs), first_chunk_s, what="every stream's first chunk")


async def stop(af: AdoptionFleet, reqs: list[AdmittedRequest]) -> None:
    with contextlib.suppress(Exception):
        for ar in reqs:
            await af.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id)))
        await af.nc.flush()
    for ar in reqs:
        await af.worker.shell.engine.abort(ar.request_id)
    dead = [h for h in af.fleet.hosts if h.nc.is_closed]
    with contextlib.suppress(Exception):
        await stop_hosts(dead)
    await stop_hosts([h for h in af.fleet.hosts if h not in dead])
    await af.nc.close()
