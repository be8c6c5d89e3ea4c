"""A submit lost with the admission process that took it (shared/client.py, subjects.RESUBMIT_HEADER).

bench.faults chaos seed 8: a NATS request sent 17 ms after the fleet's queue process (admission
in it) was SIGKILLed reached that process's dead connection; nothing answered it, and the client
ended it only by its own watchdog, 26 s later ("events lost while NATS reconnected", after the
next fault; else 504 at 60 s). Now a submit with no answer at all for natsutil.SUBMIT_ANSWER_S
(here `submit_answer_s`, shortened) is sent once more, same id, same inbox, marked; admission
stores a marked submit before anything runs, so a first that did land shows as a 409, which the
client drops while the first's stored copy comes to the inbox.

Real nats-server, admission, queue and router in one process (tests/test_queue_with_admission.py);
the dead admission is a subscription in admission's queue group that takes a submit and answers
nothing (case A), or stores it in JetStream as admission would and answers nothing (case B)."""

from __future__ import annotations

import asyncio
import time
import uuid

from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import TOK, stop_fleet, worker
from tests.test_queue_with_admission import start

FAST = {"submit_answer_s": 1.5, "idle_timeout_s": 20.0}


async def _dead_admission(url: str, store: bool = False):
    """A member of admission's queue group whose process 'died' with each submit it took: it
    answers nothing (and with `store`, first stores the request as admission would)."""
    nc = await natsutil.connect(url, "dead-admission")
    took: list[str] = []

    async def swallow(msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest)
        took.append(req.request_id)
        if store:
            core = AdmissionCore(AdmissionConfig(), TOK)
            admitted = core.admit(req, reply_to=msg.reply, json=False, headers=dict(msg.headers or {}), now=time.time(),
                                  new_id=req.request_id)
            await nc.jetstream().publish(subjects.QUEUE, codec.encode(admitted),
                                         headers={"Nats-Msg-Id": admitted.request_id})

    sub = await nc.subscribe(subjects.SUBMIT, queue=subjects.GROUP_ADMISSION, cb=swallow)
    await nc.flush()
    return nc, sub, took


class _Sees409(TokenyardClient):
    """Notes a 409 `duplicate_request_id` reaching one of its inboxes (what the reader never sees)."""

    def __init__(self, nc) -> None:
        super().__init__(nc)
        self.duplicates: list[str] = []

    def _deliver(self, msg) -> None:
        if msg.data:
            event = codec.decode_event(msg.data, msg.headers)
            if type(event) is schemas.Rejected and event.code == "duplicate_request_id":
                self.duplicates.append(event.request_id)
        super()._deliver(msg)


async def _until_the_dead_one_took_one(client, took: list[str], placed, headers=None) -> list[asyncio.Task]:
    """Submits until the server gave one to the dead admission (each of the others is `placed`)."""
    runs = []
    for i in range(40):
        req = schemas.GenerateRequest(prompt=f"resubmit {i}", max_tokens=4, request_id=f"rs-{uuid.uuid4().hex}")
        runs.append(asyncio.create_task(client.generate(req, headers=headers, **FAST)))
        await until(lambda r=req.request_id: r in took or placed(r, runs), what="an answer, or the dead admission took it")
        if took:
            return runs
    raise AssertionError("the dead admission took none of 40 submits")


async def test_a_submit_lost_with_its_admission_is_sent_again_and_served(nats_server):
    fleet = await start(nats_server.url, [worker("rs0")])
    client = await TokenyardClient.connect(nats_server.url)
    dead, sub, took = await _dead_admission(nats_server.url)
    try:
        runs = await _until_the_dead_one_took_one(client, took, lambda r, runs: runs[-1].done())
        await sub.unsubscribe()  # gone with its process: the second submit goes to the live admission
        assert len(took) == 1
        done = await asyncio.wait_for(asyncio.gather(*runs), 15)
        assert [(d.finish_reason, len(d.token_ids)) for d in done] == [("length", 4)] * len(done)
    finally:
        await dead.close()
        await client.close()
        await stop_fleet(fleet.hosts)


async def test_a_resubmit_of_a_request_that_did_land_is_dropped_as_409_and_the_first_streams(nats_server):
    fleet = await start(nats_server.url, [])  # no worker yet: every request waits in the queue (P3: no deadline)
    client = _Sees409(await natsutil.connect(nats_server.url, "client-resubmit"))
    dead, sub, took = await _dead_admission(nats_server.url, store=True)
    hosts = list(fleet.hosts)
    try:
        runs = await _until_the_dead_one_took_one(client, took, lambda r, runs: r in fleet.queue.core.policy,
                                                  {"x-request-tier": "P3"})
        await sub.unsubscribe()
        await until(lambda: took[0] in fleet.queue.core.policy, what="the queue holds the stored first")
        await until(lambda: client.duplicates, timeout_s=FAST["submit_answer_s"] + 5, what="the resubmit answered 409")
        assert client.duplicates == [took[0]]  # the swallowed one's resubmit, and only it
        assert not any(t.done() for t in runs)  # the 409 was the resubmit's: dropped, the stream waits on
        hosts.insert(0, await ServiceHost(worker("rs1"), nats_server.url).start())
        done = await asyncio.wait_for(asyncio.gather(*runs), 15)
        assert [(d.rejected, d.error, d.finish_reason, len(d.token_ids)) for d in done] == \
            [(None, None, "length", 4)] * len(done)
    finally:
        await dead.close()
        await client.close()
        await client.nc.drain()
        await stop_fleet(hosts)


async def _live_queue_peer(nc, instance_id: str) -> None:
    """Another queue replica, alive: its state every 0.1 s (a replica hears its peers so)."""
    while True:
        stats = schemas.QueueStats(instance_id=instance_id, ts=time.time(), policy="fcfs", depth=[0] * 4,
                                   work_tokens=[0] * 4)
        await nc.publish(subjects.QUEUE_STATE, codec.encode(stats))
        await asyncio.sleep(0.1)


async def test_admission_stores_a_resubmit_first_though_its_own_queue_never_saw_the_id(nats_server):
    """The first of the id is stored and left to another replica that lives (this process's queue
    naks its copy and never sees the id). A marked resubmit is a bare 409; main handed it to this
    process's queue: `accepted` first, then an `error` 409, which the client cannot tell from
    its stream's end."""
    fleet = await start(nats_server.url, [])
    peer = await natsutil.connect(nats_server.url, "queue-peer")
    alive = asyncio.create_task(_live_queue_peer(peer, "queue-peer"))
    rid = f"rs-held-{uuid.uuid4().hex}"
    try:
        await until(lambda: "queue-peer" in fleet.queue.peers, what="the queue hears its peer")
        req = schemas.GenerateRequest(prompt="held elsewhere", max_tokens=4, request_id=rid)
        first = AdmissionCore(AdmissionConfig(), TOK).admit(req, reply_to=peer.new_inbox(), json=False, headers={},
                                                            now=time.time(), new_id=rid)
        await peer.jetstream().publish(subjects.QUEUE, codec.encode(first),
                                       headers={"Nats-Msg-Id": rid, subjects.TAKEN_BY_HEADER: "queue-peer"})
        got: list = []

        async def keep(msg) -> None:
            got.append(codec.decode_event(msg.data, msg.headers))
            marks.append((msg.headers or {}).get(subjects.RESUBMIT_HEADER))

        marks: list = []

        inbox = peer.new_inbox()
        await peer.subscribe(inbox, cb=keep)
        await peer.publish(subjects.SUBMIT, codec.encode(req), reply=inbox, headers={subjects.RESUBMIT_HEADER: "1"})
        await until(lambda: got, what="admission's answer")
        await until(lambda: not fleet.admission._inflight, what="admission done with it")
        await peer.flush()
        assert rid not in fleet.queue.core.policy and rid not in fleet.queue.core.in_flight
        assert [(type(e).__name__, getattr(e, "status", None), getattr(e, "code", None)) for e in got] == [
            ("Rejected", 409, "duplicate_request_id")]
        assert marks == ["1"]  # the answer says it is the resubmit's: its client tells it from the first's
    finally:
        alive.cancel()
        await peer.drain()
        await stop_fleet(fleet.hosts)


async def _scripted_admission(url: str, on_first, on_resubmit):
    """The only admission: `on_first(nc, msg)` / `on_resubmit(nc, msg)` answer each kind of submit."""
    nc = await natsutil.connect(url, "scripted-admission")

    async def answer(msg) -> None:
        marked = (msg.headers or {}).get(subjects.RESUBMIT_HEADER)
        asyncio.create_task((on_resubmit if marked else on_first)(nc, msg))

    sub = await nc.subscribe(subjects.SUBMIT, queue=subjects.GROUP_ADMISSION, cb=answer)
    await nc.flush()
    return nc, sub


async def test_a_refused_resubmit_does_not_end_a_stream_whose_first_submit_answered_late(nats_server):
    """The first's answer comes after the resubmit left (a slow store, a stalled process); the
    resubmit is refused 503 (overload judged again). The stream has begun: the refusal is dropped,
    and the reader gets the first's stream whole, never a `rejected` after its chunks."""
    rid = f"rs-late-{uuid.uuid4().hex}"

    async def late_first(nc, msg) -> None:  # accepted just after the resubmit left, its tokens after the refusal
        await asyncio.sleep(FAST["submit_answer_s"] + 1.5)  # the client checks once a second: resubmitted by then
        await nc.publish(msg.reply, codec.encode(schemas.Accepted(rid, 1, 3)))
        await asyncio.sleep(2.0)
        for event in (schemas.Chunk(rid, 0, "a", [1], worker_id="w"), schemas.Finished(rid, 1, "length",
                                                                                      schemas.Usage(3, 1, 4))):
            await nc.publish(msg.reply, codec.encode(event))

    refused: list[str] = []

    async def refuse(nc, msg) -> None:  # judged again, a moment later: refused
        refused.append(rid)
        await asyncio.sleep(1.8)
        refusal = schemas.Rejected(rid, 503, "overloaded", "Fleet saturated")
        await nc.publish(msg.reply, codec.encode(refusal), headers={subjects.RESUBMIT_HEADER: "1"})

    nc, _ = await _scripted_admission(nats_server.url, late_first, refuse)
    watcher, aborts = await _aborts(nats_server.url)
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await asyncio.wait_for(client.generate(
            schemas.GenerateRequest(prompt="late", max_tokens=1, request_id=rid), **FAST), 10)
        assert (done.rejected, done.error, done.finish_reason, done.text) == (None, None, "length", "a")
        await watcher.flush()
        assert refused == [rid]  # the resubmit left, and its refusal came after the first's acceptance
        assert [a.reason for a in aborts if a.request_id == rid] == []  # the running first was left alone
    finally:
        await client.close()
        await nc.drain()
        await watcher.drain()


async def _aborts(url: str):
    """Every Abort published on the bus, as it comes."""
    watcher = await natsutil.connect(url, "abort-watcher")
    aborts: list = []

    async def seen(msg) -> None:
        aborts.append(codec.decode(msg.data, schemas.Abort))

    await watcher.subscribe(subjects.ABORT, cb=seen)
    await watcher.flush()
    return watcher, aborts


async def test_a_resubmit_nobody_takes_ends_in_an_error_and_stops_the_first(nats_server):
    """The first submit went to an admission that died with it; nothing takes the resubmit (no
    admission left, "no responders" for the whole window). The first may have been stored: the
    client aborts its inbox's generation and ends with an `error` 503, not `rejected` (which says
    nothing ran)."""
    rid = f"rs-none-{uuid.uuid4().hex}"
    async def swallow(nc, msg) -> None:
        pass

    nc, sub = await _scripted_admission(nats_server.url, swallow, swallow)
    watcher, aborts = await _aborts(nats_server.url)
    client = await TokenyardClient.connect(nats_server.url)
    try:
        run = asyncio.create_task(client.generate(
            schemas.GenerateRequest(prompt="none", max_tokens=1, request_id=rid), **FAST))
        await asyncio.sleep(0.5)  # the first is taken (and swallowed) before its admission goes
        await sub.unsubscribe()
        await nc.flush()
        done = await asyncio.wait_for(run, 10)
        assert done.rejected is None and (done.error.status, done.error.request_id) == (503, rid)
        await until(lambda: any(a.request_id == rid and a.reason == "client_resubmit_refused" for a in aborts),
                    what="the first's generation stopped")
    finally:
        await client.close()
        await nc.drain()
        await watcher.drain()
