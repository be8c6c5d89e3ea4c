"""A request asked for again is the same request, at each hop that may ask twice:

* the queue: a route ask the router never answered (a timeout) may have been placed, so the
  request stays in flight, does not expire, and is asked again first (QueueCore.on_route_lost);
  only a definite `no_capacity` puts it back in line;
* the router: the same request (id and reply subject) asked while its placement runs, or
  after it was routed, gets that placement's decision, with no second offer;
* the worker: an offer of a request it already took is accepted with no second generation and
  no word to the client (REOFFERED); another request with the id gets a 409.

Found by bench/faults: in queue-kill 63 of 1,200 requests ended in a 409, the answer to a
re-ask of the same request after a route timeout (the worker's core said "duplicate", the
shell took it for a reused id: a StrEnum equals its string); in nats-restart 11 SSE streams
ended with the queue's deadline rejection while a worker streamed them (their `routed` was
lost in the outage, the queue put them back, `expire` rejected them).
"""

from __future__ import annotations

import asyncio
import time

from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig, MigrationCore
from tokenyard.services.router.reask import key_of
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker import shell as worker_shell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders
from tests.builders import MODEL, hb, req
from tests.conftest import until
from tests.test_worker_outage import StepEngine

# ───────────────────────────── the queue ─────────────────────────────


def queue() -> QueueCore:
    return QueueCore(QueueConfig(flow_control=False, slots_per_worker=1, retry_backoff_s=0.05), FCFS())


def test_an_unanswered_route_ask_is_asked_again_and_does_not_expire():
    q = queue()
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(req("a", priority=1), 0.0)  # P1: released by 4.75 s at the latest, else rejected
    q.offer(req("b", priority=1), 0.0)
    assert [r.request_id for r in q.dispatchable(0.0)] == ["a"]
    q.on_route_lost("a", 9.0)  # the router's answer never came, and the deadline has passed
    rejected = q.expire(9.0)
    assert [(r.request_id, x.code) for r, x in rejected] == [("b", "deadline_exceeded")]  # only b waited
    assert q.dispatchable(9.0) == []  # the retry backoff
    assert [r.request_id for r in q.dispatchable(9.05)] == ["a"]  # asked again, still in flight
    assert list(q.in_flight) == ["a"] and len(q) == 0
    assert q.expire(20.0) == []
    assert q.on_routed("a", "w0", 20.0).request_id == "a"  # the router: `routed` (it had placed it)
    assert q.in_flight == {} and q.dispatchable(20.1) == []


def test_a_definite_no_capacity_after_a_lost_answer_puts_the_request_back_where_it_may_expire():
    q = queue()
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(req("a", priority=1), 0.0)
    q.dispatchable(0.0)
    q.on_route_lost("a", 1.0)
    assert [r.request_id for r in q.dispatchable(1.05)] == ["a"]
    q.on_not_routed("a", 6.0)  # asked again: nobody has it and nobody took it
    assert [r.request_id for r, _ in q.expire(6.0)] == ["a"]


def test_a_lost_answer_for_a_request_no_longer_in_flight_changes_nothing():
    q = queue()
    q.on_route_lost("zz", 1.0)
    assert q.unsure == {} and q.paused_until == 0.0


# ───────────────────────────── the router ─────────────────────────────


async def test_the_router_answers_the_same_request_asked_again_from_its_one_placement(nats_server):
    """The queue's ask times out while the worker is slow to answer the offer; the queue asks
    again (twice): one offer in all, each later ask answered `routed` to the same worker, and
    the router still follows the stream (migration)."""
    shell = RouterShell(RouterConfig(policy="least-loaded"))
    host = await ServiceHost(shell, nats_server.url).start()
    nc = await natsutil.connect(nats_server.url, "test-reoffer")
    offers: list[str] = []
    answer = asyncio.Event()

    def worker(wid: str):
        async def cb(msg):
            ar = codec.decode(msg.data, schemas.AdmittedRequest)
            offers.append(wid)
            await answer.wait()
            reason = schemas.REOFFERED if offers.count(wid) > 1 else ""
            await msg.respond(codec.encode(schemas.GenerateReply(ar.request_id, True, reason)))

        return cb

    try:
        for wid in ("wa", "wb"):
            await nc.subscribe(subjects.worker_generate(wid), cb=worker(wid))
            await nc.publish(subjects.heartbeat(wid), codec.encode(builders.hb(wid, model=MODEL, ts=time.time())))
        await until(lambda: shell.core.view.n == 2)
        asked = req("rq1", reply_to=nc.new_inbox(), arrival_s=time.time())
        ar = codec.encode(asked)
        first = asyncio.create_task(nc.request(subjects.ROUTE, ar, timeout=0.3))
        await until(lambda: offers)
        try:
            await first
            raise AssertionError("the first ask was to time out")
        except TimeoutError:
            pass
        again = asyncio.create_task(nc.request(subjects.ROUTE, ar, timeout=5))
        # both asks in the router, the offer unanswered: the second joined the first's placement
        await until(lambda: len(shell.reask.placing.get(key_of(asked), [])) == 1)
        answer.set()
        decision = codec.decode((await again).data, schemas.RouteDecision)
        assert (decision.outcome, decision.worker_id) == ("routed", offers[0])
        third = codec.decode((await nc.request(subjects.ROUTE, ar, timeout=5)).data, schemas.RouteDecision)
        assert (third.outcome, third.worker_id) == ("routed", offers[0])
        assert len(offers) == 1
        assert shell.migration.tracked["rq1"].worker_id == offers[0]
    finally:
        await nc.drain()
        await host.stop()


async def test_an_unanswered_offer_ends_the_placement_unsure_and_the_next_ask_goes_to_that_worker(
        nats_server, monkeypatch):
    """wa takes the request but answers after the router's offer timeout. Before, the router
    offered it to wb at once, which took it too: two generations on one stream (and with one
    worker, `no_capacity`, which let the queue expire a request that wa streamed). Now the
    ask ends `unsure`, and the next ask is offered to wa first, which says it has it."""
    monkeypatch.setattr(router_shell, "OFFER_TIMEOUT_S", 0.2)
    shell = RouterShell(RouterConfig(policy="least-loaded"))
    host = await ServiceHost(shell, nats_server.url).start()
    nc = await natsutil.connect(nats_server.url, "test-reoffer")
    offers: list[str] = []
    late = asyncio.Event()

    def worker(wid: str):
        async def cb(msg):
            ar = codec.decode(msg.data, schemas.AdmittedRequest)
            offers.append(wid)
            if offers.count(wid) == 1 and wid == "wa":
                await late.wait()  # taken, answered too late: the router has given up
            reason = schemas.REOFFERED if offers.count(wid) > 1 else ""
            await msg.respond(codec.encode(schemas.GenerateReply(ar.request_id, True, reason)))

        return cb

    try:
        for wid, running in (("wa", 0), ("wb", 3)):  # least-loaded offers wa first
            await nc.subscribe(subjects.worker_generate(wid), cb=worker(wid))
            beat = builders.hb(wid, running=running, model=MODEL, ts=time.time())
            await nc.publish(subjects.heartbeat(wid), codec.encode(beat))
        await until(lambda: shell.core.view.n == 2)
        ar = codec.encode(req("rq2", reply_to=nc.new_inbox(), arrival_s=time.time()))
        first = codec.decode((await nc.request(subjects.ROUTE, ar, timeout=5)).data, schemas.RouteDecision)
        assert (first.outcome, first.unsure, first.reason) == ("no_capacity", True, "no answer from wa")
        assert offers == ["wa"]
        assert shell.migration.tracked["rq2"].worker_id == ""  # still followed, on no worker yet
        for wid, running in (("wa", 5), ("wb", 0)):  # placement alone would now pick wb
            beat = builders.hb(wid, running=running, model=MODEL, ts=time.time(), seq=2)
            await nc.publish(subjects.heartbeat(wid), codec.encode(beat))
        view = shell.core.view
        await until(lambda: view.stats[view.slot["wa"]].running == 5 and view.stats[view.slot["wb"]].running == 0)
        late.set()
        again = codec.decode((await nc.request(subjects.ROUTE, ar, timeout=5)).data, schemas.RouteDecision)
        assert (again.outcome, again.worker_id, again.unsure) == ("routed", "wa", False)
        assert offers == ["wa", "wa"]  # wb never had it
        assert shell.migration.tracked["rq2"].worker_id == "wa"
    finally:
        await nc.drain()
        await host.stop()


# ───────────────────────────── migration ─────────────────────────────


def test_a_stream_that_ended_is_not_tracked_again_by_a_late_offer_reply():
    """The offer's reply and the stream come on different subscriptions: the `finished` may be
    handled first. Tracking the request after it would follow a finished stream until its
    worker stops, and then re-issue it (queue-kill's end: 47 × `worker w-late died`)."""
    m = MigrationCore()
    r = req("r1")
    m.track(r, "", 0.0)
    m.on_event("r1", schemas.Finished("r1", 1, "length", schemas.Usage(20, 1, 21)), 0.1)
    m.track(r, "w0", 0.2)
    assert m.tracked == {}
    m.track(req("r1", reply_to="inbox.other"), "w0", 0.3)  # another request with the id is followed
    assert list(m.tracked) == ["r1"]


def test_a_worker_is_alive_while_heard_from_within_dead_after_s():
    m = MigrationCore(MigrationConfig(dead_after_s=3.0))
    assert not m.alive("w0", 0.0)
    m.on_heartbeat("w0", 1.0)
    assert m.alive("w0", 3.9) and not m.alive("w0", 4.0)
    m.on_no_responders("w0", 2.0)
    assert not m.alive("w0", 2.0)


# ───────────────────────────── the worker ─────────────────────────────


class Inboxes:
    """What the worker's stream path publishes, per subject."""

    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}
        self.published: list[tuple[str, schemas.StreamEvent]] = []

    async def publish(self, subject: str, data: bytes, headers=None) -> None:
        self.published.append((subject, codec.decode_event(data, headers)))


class Offer:
    """A micro request on the worker's generate endpoint."""

    def __init__(self, ar: schemas.AdmittedRequest) -> None:
        self.data, self.headers = codec.encode(ar), None
        self.reply: schemas.GenerateReply | None = None

    async def respond(self, data: bytes, headers=None) -> None:
        self.reply = codec.decode(data, schemas.GenerateReply)


async def test_a_worker_answers_the_same_request_again_without_a_word_to_its_client():
    engine = StepEngine()
    shell = worker_shell.WorkerShell(WorkerConfig("w0", MODEL), engine, ByteTokenizer())
    shell.nc = nc = Inboxes()
    ar = req("r1", max_tokens=1)
    await shell.on_generate(offer := Offer(ar))
    await until(lambda: offer.reply is not None, what="the answer (at the first event, or REPLY_HOLD_S)")
    assert offer.reply == schemas.GenerateReply("r1", True)
    await shell.on_generate(again := Offer(ar))  # a re-ask, a redelivery: the same request
    assert again.reply == schemas.GenerateReply("r1", True, schemas.REOFFERED)
    assert nc.published == [] and shell.generating == ["r1"]  # one generation, no 409
    await shell.on_generate(reused := Offer(req("r1", reply_to="inbox.other")))  # another request
    assert reused.reply == schemas.GenerateReply("r1", True, schemas.Outcome.DUPLICATE)
    assert nc.published == [("inbox.other", schemas.Error("r1", 409, "request id 'r1' is already in use"))]
    await engine.steps.put(EngineOutput("r1", [65], finished=True, finish_reason="length"))
    await until(lambda: not shell.generating)
    to_client = [type(e).__name__ for subject, e in nc.published if subject == ar.reply_to]
    assert to_client == ["Chunk", "Finished"]
