"""A hand-over whose AdoptReply is lost leaves its streams with the router that adopted them, and
no second router follows them (shared/adoption.py). Live, on the session's secured nats-server:
one worker; router A places three long streams; router B starts; A's connection closes. The
worker hands the streams to B, which follows them, but B's AdoptReply never reaches the worker
(dropped here). Router C starts, and any later hand-over B receives is passed to C.

Before the fix the worker, missing the reply, credited the streams to A still, handed them over
again some 6 s later, and C followed them too: if the worker had died then, B and C would both
have re-issued each stream to its client (two generations on one stream). Now the worker asks B
(`llm.v1.router.<id>.adopted`) which it follows and follows B for all three; no second hand-over
happens, C follows nothing. When B's connection closes in turn, the worker, now probing B, hands
the streams to C."""

from __future__ import annotations

import contextlib

from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.adoption import AdoptAsk
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req
from tests.conftest import InProcFleet, stop_hosts, until

STREAMS = 3


async def test_a_lost_adopt_reply_leaves_the_streams_with_their_adopter_and_no_second_router_follows(
        nats_server, monkeypatch):
    real_on_adopt = router_shell.on_adopt
    hosts: dict[str, object] = {}
    b_asks = []

    async def on_adopt(shell, msg):
        """Router B adopts the first hand-over but its AdoptReply is lost; any later one B gets
        goes to C (so a second hand-over, if any, surely reaches another router)."""
        if "b" not in hosts or shell is not hosts["b"].shell:
            return await real_on_adopt(shell, msg)
        b_asks.append(msg.data)
        if len(b_asks) == 1:
            msg.reply = ""  # on_adopt answers only a message with a reply subject
            return await real_on_adopt(shell, msg)
        return await real_on_adopt(hosts["c"].shell, msg)

    monkeypatch.setattr(router_shell, "on_adopt", on_adopt)  # bound by each router's start
    fleet = InProcFleet(nats_server.url, None)
    engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=0.25)
    worker = await fleet.add(WorkerShell(WorkerConfig("lw0", config.DEFAULT_MODEL, flow_control=False), engine,
                                         ByteTokenizer()))
    router_a = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
    nc = await natsutil.connect(nats_server.url, "lost-reply-client")
    handovers: list[list[str]] = []

    async def on_ask(msg):
        handovers.append([r.request_id for r in codec.decode(msg.data, AdoptAsk).requests])

    await nc.subscribe(subjects.ADOPT, cb=on_ask)
    got: dict[str, int] = {}

    async def on_event(msg):
        rid = codec.decode_event(msg.data, msg.headers).request_id
        got[rid] = got.get(rid, 0) + 1

    await nc.subscribe("_INBOX.lostreply.*", cb=on_event)
    reqs = [req(f"lost-{i}", prompt_len=64, max_tokens=4000, reply_to=f"_INBOX.lostreply.{i}",
                model=config.DEFAULT_MODEL) for i in range(STREAMS)]
    ids = {ar.request_id for ar in reqs}
    core = worker.shell.core
    try:
        await until(lambda: "lw0" in router_a.shell.core.view.ids, 10, what="router A hears the worker")
        for ar in reqs:
            decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=10)).data,
                                    schemas.RouteDecision)
            assert decision.outcome == schemas.Outcome.ROUTED, decision
        await until(lambda: len(got) == STREAMS, 30, what="every stream's first chunk")
        [by_a] = {st.placed_by for st in core.streams.values()}
        hosts["b"] = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
        b = hosts["b"].shell
        await router_a.nc.close()  # router A is gone from the bus
        await until(lambda: ids <= set(b.migration.tracked), 30, 0.05, what="router B adopts every stream")
        assert len(b_asks) == 1  # its AdoptReply dropped
        hosts["c"] = await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
        c = hosts["c"].shell

        def credited_to_b() -> bool:
            return ids <= set(core.streams) and all(core.streams[rid].placed_by not in ("", by_a) for rid in ids)

        # the fix credits B at the missing reply's timeout; before it, C followed the streams ~6 s later
        await until(lambda: credited_to_b() or c.migration.tracked, 40, 0.05,
                    what="the worker to credit B, or C to follow the streams")
        assert not c.migration.tracked, "a second router follows the streams"
        assert credited_to_b()
        [by_b] = {st.placed_by for st in core.streams.values()}
        await until(lambda: by_a not in core.routers.proven, 10, what="the worker to stop following A")
        assert not c.migration.tracked and ids <= set(b.migration.tracked)
        assert handovers == [sorted(ids)] and len(b_asks) == 1  # one hand-over only
        # B is the one followed now: when it goes, the streams go to C
        await hosts["b"].nc.close()
        await until(lambda: ids <= set(c.migration.tracked), 30, 0.05, what="the worker hands the streams to C")
        await until(lambda: all(core.streams[rid].placed_by not in ("", by_a, by_b) for rid in ids), 10,
                    what="the worker to follow C")
        assert len(handovers) == 2 and sorted(handovers[1]) == sorted(ids)
    finally:
        with contextlib.suppress(Exception):
            for ar in reqs:
                await nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id)))
            await nc.flush()
        for ar in reqs:
            await worker.shell.engine.abort(ar.request_id)
        dead = [h for h in fleet.hosts if h.nc.is_closed]
        with contextlib.suppress(Exception):
            await stop_hosts(dead)
        await stop_hosts([h for h in fleet.hosts if h not in dead])
        await nc.close()
