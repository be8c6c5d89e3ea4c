"""The router service over a real nats-server: it takes heartbeats and KV events from their
fan-out subjects, routes a request to the worker that caches its prefix, retries elsewhere on
a refusal, and puts the decision's inputs on its span."""

from __future__ import annotations

import time

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.service import ServiceHost

from tests import builders
from tests.conftest import until

CHAIN = ids_chain(range(100, 104))


async def test_the_router_follows_kv_events_and_records_its_inputs(nats_server, spans):
    shell = RouterShell(RouterConfig(policy="multiplicative"))
    host = await ServiceHost(shell, nats_server.url).start()
    nc = await natsutil.connect(nats_server.url, "test-router-shell")
    offers: list[str] = []

    def worker(wid: str, accept: bool):
        async def cb(msg):
            ar = codec.decode(msg.data, schemas.AdmittedRequest)
            offers.append(wid)
            await msg.respond(
                codec.encode(schemas.GenerateReply(ar.request_id, accept, "" if accept else "full"))
            )

        return cb

    try:
        for wid, accept in (("wa", True), ("wb", True), ("wc", False)):
            await nc.subscribe(subjects.worker_generate(wid), cb=worker(wid, accept))
        stored = schemas.BlockStored(block_hashes=CHAIN, parent_block_hash=None, token_ids=[], block_size=16)
        await nc.publish(subjects.kv_events("wa"), codec.encode(schemas.KVEventBatch(time.time(), [stored])))
        await nc.publish(subjects.kv_events("wc"), codec.encode(schemas.KVEventBatch(time.time(), [stored])))
        await nc.publish(subjects.kv_events("wb"), b"not a batch")  # logged and dropped
        for wid, running in (("wa", 3), ("wb", 0), ("wc", 0)):
            hb = builders.hb(wid, running=running, used=10, free=990, model="tokenyard-sim", ts=time.time())
            await nc.publish(subjects.heartbeat(wid), codec.encode(hb))
        await nc.flush()
        await until(lambda: shell.core.view.n == 3 and len(shell.core.index) == 4)
        assert shell.core.index.holders_of(CHAIN[0]) == ["wa", "wc"]

        spans.clear()
        ar = builders.req("rq1", 70, 4, 1, model="tokenyard-sim", chain=CHAIN, arrival_s=time.time(), reply_to="inbox")
        reply = await nc.request(subjects.ROUTE, codec.encode(ar), timeout=5)
        decision = codec.decode(reply.data, schemas.RouteDecision)
        # wc: P = 70 − 64 = 6, × (0 + 1) = 6 → offered first, refuses; wa: 6 × 4 = 24 < wb: 70 × 1
        assert (decision.outcome, decision.worker_id) == ("routed", "wa")
        assert offers == ["wc", "wa"]
        await until(
            lambda: any(s.attributes.get("tokenyard.router.instance") for s in spans.get_finished_spans())
        )
        span = next(s for s in spans.get_finished_spans() if s.attributes.get("tokenyard.router.instance"))
        attrs = {k: v for k, v in span.attributes.items() if k.startswith("tokenyard.router.")}
        assert attrs == {
            "tokenyard.router.policy": "multiplicative",
            "tokenyard.router.candidates": 2,
            "tokenyard.router.fallback": "",
            "tokenyard.router.hot_warning": False,
            "tokenyard.router.instance": "wa",
            "tokenyard.router.p_tokens": 6.0,
            "tokenyard.router.batch_size": 3,
            "tokenyard.router.hit_tokens": 64,
            "tokenyard.router.score": 24.0,
            "tokenyard.router.over_budget": False,
        }
    finally:
        await nc.drain()
        await host.stop()
