"""A request its client aborted is no longer followed by the router that placed it, however
the abort and the placement interleave (over a real nats-server, hand-written workers). Found by
bench/soak.py: NATS clients leaving after a few chunks of fast streams left most of their
requests tracked and followed for good (a subscription and a _Tracked each)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from tests import builders
from tests.conftest import until

MODEL = "tokenyard-sim"


async def _heartbeats(nc, running: dict[str, int]) -> None:
    while True:
        for wid, n in running.items():
            await nc.publish(subjects.heartbeat(wid), codec.encode(builders.hb(wid, running=n, model=MODEL, ts=time.time())))
        await asyncio.sleep(0.1)


async def test_an_abort_that_overtakes_the_offers_reply_ends_the_following(nats_server):
    """The client read its first chunks and left before the router had the worker's reply to
    the offer (a fast stream; a busy router process): the reply must not start the following
    again, with no event left to end it."""
    shell = RouterShell(RouterConfig(policy="least-loaded"))
    host = await ServiceHost(shell, nats_server.url).start()
    nc = await natsutil.connect(nats_server.url, "test-router-abort-follow")

    async def worker(msg):
        ar = codec.decode(msg.data, schemas.AdmittedRequest)
        await nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id, reason="client")))
        await until(lambda: ar.request_id not in shell.migration.tracked, what="the abort handled first")
        await msg.respond(codec.encode(schemas.GenerateReply(ar.request_id, True)))

    beats = asyncio.create_task(_heartbeats(nc, {"wa": 0}))
    try:
        await nc.subscribe(subjects.worker_generate("wa"), cb=worker)
        await until(lambda: shell.core.view.n == 1)
        ar = builders.req("rq1", 20, 4, model=MODEL, arrival_s=time.time(), reply_to="inbox.rq1")
        decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=5)).data,
                                schemas.RouteDecision)
        assert (decision.outcome, decision.worker_id) == ("routed", "wa")
        assert "rq1" not in shell.migration.tracked and "rq1" not in shell.follows
        assert shell.migration.ended["rq1"] == "inbox.rq1"
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await nc.drain()
        await host.stop()


async def test_a_reissue_answered_aborted_ends_the_following(nats_server):
    """Its worker lost the stream (a probe finds it not running): the router re-issues it, and
    the next worker answers `aborted` (every worker heard the client's abort). The request ends
    there: it was left tracked, `reissuing`, and followed for good."""
    shell = RouterShell(RouterConfig(policy="least-loaded"),
                        migration=MigrationConfig(silence_s=0.3, probe_every_s=0.1))
    host = await ServiceHost(shell, nats_server.url).start()
    nc = await natsutil.connect(nats_server.url, "test-router-reissue-aborted")
    offers: list[str] = []

    def worker(wid: str, reason: str):
        async def cb(msg):
            ar = codec.decode(msg.data, schemas.AdmittedRequest)
            offers.append(wid)
            await msg.respond(codec.encode(schemas.GenerateReply(ar.request_id, not reason, reason)))
        return cb

    async def status(msg):
        await msg.respond(msgspec.msgpack.encode([]))  # wa runs nothing: it lost the stream

    beats = asyncio.create_task(_heartbeats(nc, {"wa": 0, "wb": 5}))  # wa the less loaded: offered first
    try:
        await nc.subscribe(subjects.worker_generate("wa"), cb=worker("wa", ""))
        await nc.subscribe(subjects.worker_generate("wb"), cb=worker("wb", schemas.Outcome.ABORTED))
        await nc.subscribe(subjects.worker_status("wa"), cb=status)
        await until(lambda: shell.core.view.n == 2)
        ar = builders.req("rq2", 20, 4, model=MODEL, arrival_s=time.time(), reply_to="inbox.rq2")
        decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=5)).data,
                                schemas.RouteDecision)
        assert (decision.outcome, decision.worker_id) == ("routed", "wa")
        await until(lambda: offers == ["wa", "wb"], what="the re-issue offered to wb")
        await until(lambda: "rq2" not in shell.migration.tracked and "rq2" not in shell.follows,
                    timeout_s=5.0, what="rq2 no longer followed")
        assert shell.migration.ended["rq2"] == "inbox.rq2"
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await nc.drain()
        await host.stop()
