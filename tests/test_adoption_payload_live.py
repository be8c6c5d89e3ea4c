"""A hand-over too big for one NATS message goes in pieces (shared/adoption.py): live, on a
secured nats-server of this module's own whose max_payload is 32 KiB. One worker; router A
places 12 streams whose prompts and resumed tokens (~9 KB a request encoded, ~4.5 KB of state
each) make an AdoptAsk of ~110 KB; router B starts; A's connection closes. The worker hands all
12 to B, in several asks that each fit the room, and follows B for every one. (In one message
the ask raised MaxPayloadError at every probe and nothing was ever adopted.)"""

from __future__ import annotations

import contextlib

import pytest
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, nats_auth, natsutil, schemas, subjects
from tokenyard.shared.adoption import AdoptAsk, message_room
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req
from tests.conftest import InProcFleet, stop_hosts, until

MAX_PAYLOAD = 32 * 1024
STREAMS = 12
N = 1500
"""Prompt and resumed token ids per request (3 bytes each in MessagePack)."""


@pytest.fixture(scope="module")
async def small_nats(tmp_path_factory):
    auth = nats_auth.FleetAuth.generate(tmp_path_factory.mktemp("small-creds"))
    server = await natsutil.NatsServer(auth=auth, max_payload=MAX_PAYLOAD).start()
    yield server
    server.stop()


async def test_a_hand_over_bigger_than_max_payload_goes_in_pieces_and_every_stream_is_adopted(small_nats):
    fleet = InProcFleet(small_nats.url, None)
    engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=0.25)
    worker = await fleet.add(WorkerShell(WorkerConfig("pw0", config.DEFAULT_MODEL, flow_control=False), engine, ByteTokenizer()))
    router_a = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
    nc = await natsutil.connect(small_nats.url, "adoption-payload-client")
    asks: list[bytes] = []

    async def on_ask(msg):
        asks.append(msg.data)

    await nc.subscribe(subjects.ADOPT, cb=on_ask)
    got: dict[str, int] = {}

    async def on_event(msg):
        rid = codec.decode_event(msg.data, msg.headers).request_id
        got[rid] = got.get(rid, 0) + 1

    await nc.subscribe("_INBOX.payloadclient.*", cb=on_event)
    reqs = [req(f"big-{i}", tokens=range(1000, 1000 + N), max_tokens=4 * N, reply_to=f"_INBOX.payloadclient.{i}",
                model=config.DEFAULT_MODEL, resume_token_ids=list(range(2000, 2000 + N)), resume_seq=N, migrations=1)
            for i in range(STREAMS)]
    assert len(codec.encode(AdoptAsk("pw0", reqs))) > 3 * MAX_PAYLOAD  # one message could not carry it
    try:
        await until(lambda: "pw0" in router_a.shell.core.view.ids, 10, what="router A hears the worker")
        for ar in reqs:
            decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=10)).data,
                                    schemas.RouteDecision)
            assert decision.outcome == schemas.Outcome.ROUTED, decision
        await until(lambda: len(got) == STREAMS, 60, what="every stream's first chunk")
        router_b = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
        await until(lambda: "pw0" in router_b.shell.core.view.ids, 10, what="router B hears the worker")
        placed_by = {st.placed_by for st in worker.shell.core.streams.values()}
        assert len(placed_by) == 1 and "" not in placed_by  # router A's `alive` subject
        await router_a.nc.close()  # router A is gone from the bus
        b = router_b.shell
        await until(lambda: all(ar.request_id in b.migration.tracked for ar in reqs), 60, 0.05,
                    what="the worker hands every stream to router B")
        assert set(b.following) >= {ar.request_id for ar in reqs}
        await until(lambda: not {st.placed_by for st in worker.shell.core.streams.values()} & placed_by, 10,
                    what="the worker to follow router B for every stream")  # B commits before its last reply lands
        followed = {st.placed_by for st in worker.shell.core.streams.values()}
        assert len(followed) == 1 and followed != placed_by  # every stream now router B's
        assert len(asks) >= 3 and all(len(a) <= message_room(MAX_PAYLOAD) for a in asks)
        assert sorted(r.request_id for a in asks for r in codec.decode(a, AdoptAsk).requests) == sorted(
            ar.request_id for ar in reqs)
    finally:
        with contextlib.suppress(Exception):
            for ar in reqs:
                await nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id)))
            await nc.flush()
        for ar in reqs:
            await worker.shell.engine.abort(ar.request_id)
        dead = [router_a] if router_a.nc.is_closed else []
        with contextlib.suppress(Exception):
            await stop_hosts(dead)
        await stop_hosts([h for h in fleet.hosts if h not in dead])
        await nc.close()
