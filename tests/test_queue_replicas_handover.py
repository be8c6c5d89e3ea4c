"""Two queue replicas, admission in the first's process: the stored copy of a request handed
over there must not be placed again by the other replica once it is routed — not when the
copy sits with the other replica while the first goes silent (a pause, a crash) — and a
request not yet routed when the first goes silent is placed by the other (nothing admitted
lost). Against a real nats-server; the first replica is made to never pull, so that every
stored copy reaches the other one (which hands it back while the first is heard)."""

from __future__ import annotations

import asyncio
import uuid

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.peer_watch import PEER_SILENT_S, TAKEN_RETRY_S
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import TOK, Recorder, stop_fleet, worker


class Pair:
    """Replica `a` (router, queue that never pulls, admission) and replica `b` (router, queue)."""

    def __init__(self, hosts, admission, a, a_router, b, b_router):
        self.hosts, self.admission = hosts, admission
        self.a, self.a_router, self.b, self.b_router = a, a_router, b, b_router

    def silence_a(self) -> None:
        """`a` stops publishing its QueueStats, as a paused or dead replica does (a fault: a
        replica has no public way to fall silent while it stays connected)."""
        for task in self.a._tasks:
            if task.get_coro().__name__ == "_stats_loop":
                task.cancel()


async def two_workers(url: str) -> tuple[list, list[ServiceHost]]:
    """An empty queue stream and two simulated workers, rw0 and rw1, each hosted."""
    nc = await natsutil.connect(url, "replicas-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    workers = [worker("rw0"), worker("rw1")]
    return workers, [await ServiceHost(w, url).start() for w in workers]


async def start_pair(url: str) -> Pair:
    workers, hosts = await two_workers(url)
    a_router, b_router = RouterShell(RouterConfig(policy="least-loaded")), RouterShell(RouterConfig(policy="least-loaded"))
    a, b = QueueShell(QueueConfig(), FCFS(), router=a_router), QueueShell(QueueConfig(), FCFS(), router=b_router)

    async def never_pulls() -> None:
        return None

    a._pull_loop = never_pulls  # every stored copy reaches `b` (a fault set-up: no public way)
    admission = AdmissionShell(AdmissionConfig(), TOK, queue=a)
    for shell in (a_router, a, admission, b_router, b):
        hosts.append(await ServiceHost(shell, url).start())
    ids = {w.core.cfg.worker_id for w in workers}
    await until(lambda: ids <= set(a_router.core.view.ids) and ids <= set(b_router.core.view.ids)
                and ids <= set(a.core.workers) and ids <= set(b.core.workers)
                and ids <= set(admission.core.fleet.workers) and a.instance_id in b.peers)
    return Pair(hosts, admission, a, a_router, b, b_router)


async def stream_state(url: str) -> tuple[int, int]:
    """(messages in the queue's stream, deliveries its consumer waits to see acked)."""
    nc = await natsutil.connect(url, "replicas-check")
    try:
        js = nc.jetstream()
        messages = (await js.stream_info(subjects.QUEUE_STREAM)).state.messages
        pending = (await js.consumer_info(subjects.QUEUE_STREAM, subjects.QUEUE_CONSUMER)).num_ack_pending
        return messages, pending
    finally:
        await nc.drain()


async def test_a_routed_requests_stored_copy_is_not_placed_again_by_another_replica_when_its_taker_goes_silent(
        nats_server):
    pair = await start_pair(nats_server.url)
    client = await TokenyardClient.connect(nats_server.url)
    rec = Recorder()
    try:
        running = asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt="long " * 4, max_tokens=600)))
        await until(lambda: rec.tokens() > 0 and not pair.admission.handing_over)  # routed, and its store acked
        rid = rec.events[0].request_id
        assert [k[0] for k in pair.a_router.reask.placed] == [rid]
        pair.silence_a()
        # The copy is gone from the stream while the request still runs: no replica can place it.
        state = {}

        async def copy_gone() -> bool:
            state["now"] = await stream_state(nats_server.url)
            return state["now"] == (0, 0)

        async with asyncio.timeout(10):
            while not await copy_gone():
                await asyncio.sleep(0.05)
        assert not running.done()  # still generating on its worker: the copy went while it ran
        assert not pair.b_router.reask.placed and not pair.b.held and len(pair.b.core) == 0
        kept = pair.a.kept()
        assert (kept["local"], kept["stored"], kept["held"]) == (0, 0, 0)  # nothing kept for it here
        await asyncio.wait_for(running, 30)
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 600 and rec.seqs() == list(range(len(rec.seqs())))
        assert not pair.b_router.reask.placed  # not placed by `b` while it ran, nor after
    finally:
        await client.close()
        await stop_fleet(pair.hosts)


async def test_a_handed_request_not_yet_routed_when_its_taker_goes_silent_is_placed_by_another_replica(nats_server):
    pair = await start_pair(nats_server.url)
    stuck, stalled = asyncio.Event(), []

    async def never_answers(*args, **kwargs):
        stuck.set()
        stalled.append(asyncio.current_task())  # `a`'s route task, which awaits this call
        await asyncio.Event().wait()  # `a`'s router never places it: `a` stalls with it in flight

    pair.a_router.route = never_answers
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = asyncio.create_task(client.generate(schemas.GenerateRequest(prompt="orphan", max_tokens=5)))
        await asyncio.wait_for(stuck.wait(), 20)  # bounded: a missed step fails, not hangs
        await until(lambda: not pair.admission.handing_over)  # stored and acked, not routed
        pair.silence_a()
        got = await asyncio.wait_for(done, 10 + PEER_SILENT_S)
        assert got.finish_reason == "length" and len(got.token_ids) == 5, got
        # the stream can end before `b`'s router has read the worker's answer: its route call returns after
        await until(lambda: pair.b.kept()["routes"] == 0, what="`b`'s route call to return")
        assert [k[0] for k in pair.b_router.reask.placed] == [got.request_id]  # placed once, by `b`
    finally:
        for task in stalled:  # `a`'s stalled route, which its stop would wait for
            task.cancel()
        await client.close()
        await stop_fleet(pair.hosts)


async def test_a_reused_id_placed_by_another_replica_before_its_409_is_stopped_and_the_first_runs_on(nats_server):
    """The first request of an id runs on rw0, handed over by replica `a`'s admission; the same
    id then reaches replica `b`'s admission, whose queue never saw it: it is placed (on rw1, the
    idle one) before its store finds the id taken. Its 409 stops that generation alone."""
    url = nats_server.url
    nc = await natsutil.connect(url, "replicas-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    rw0, rw1 = worker("rw0"), worker("rw1")
    hosts = [await ServiceHost(w, url).start() for w in (rw0, rw1)]

    async def replica() -> tuple[AdmissionShell, RouterShell, list[ServiceHost]]:
        router = RouterShell(RouterConfig(policy="least-loaded"))
        queue = QueueShell(QueueConfig(), FCFS(), router=router)
        admission = AdmissionShell(AdmissionConfig(), TOK, queue=queue)
        started = [await ServiceHost(s, url).start() for s in (router, queue, admission)]
        await until(lambda: {"rw0", "rw1"} <= set(router.core.view.ids) and {"rw0", "rw1"} <= set(queue.core.workers)
                    and {"rw0", "rw1"} <= set(admission.core.fleet.workers))
        return admission, router, started

    _, a_router, a_hosts = await replica()
    hosts += a_hosts
    client = await TokenyardClient.connect(url)
    rid = f"reused-{uuid.uuid4().hex}"
    first = Recorder()
    try:
        running = asyncio.create_task(first.run(client, schemas.GenerateRequest(
            prompt="first " * 4, max_tokens=500, request_id=rid)))
        await asyncio.wait_for(first.first_chunk.wait(), 20)  # bounded: a missed step fails, not hangs
        assert set(rw0.generating) == {rid}
        await a_hosts[2].stop()  # `a`'s admission leaves the submit group: `b`'s gets the next request
        _, b_router, b_hosts = await replica()
        hosts += b_hosts
        newcomer = await asyncio.wait_for(client.generate(schemas.GenerateRequest(
            prompt="second " * 4, max_tokens=2000, request_id=rid)), 10)
        assert newcomer.error is not None and newcomer.error.status == 409, newcomer
        await until(lambda: list(b_router.reask.placed.values()) == ["rw1"])  # `b` did place it, on rw1
        await until(lambda: not rw1.generating, timeout_s=5)  # stopped there by its 409
        assert set(rw0.generating) == {rid}  # the first runs on
        await asyncio.wait_for(running, 30)
        assert isinstance(first.last, schemas.Finished) and first.tokens() == 500
    finally:
        await client.close()
        await stop_fleet(hosts)


async def test_a_replica_started_a_moment_ago_and_not_yet_heard_keeps_the_copies_it_took(nats_server):
    """Chaos seed 12: the queue process was killed and started again; the new front's admission
    took a submit before its first state reached the standby (`b`, running for long), so `b` had
    never heard of the copy's taker and placed it too: two workers ran the request. `b` now leaves
    a never-heard taker's copy to it for PEER_SILENT_S after the first came, and `a`, having
    routed it, deletes it."""
    url = nats_server.url
    workers, hosts = await two_workers(url)
    b_router = RouterShell(RouterConfig(policy="least-loaded"))
    b = QueueShell(QueueConfig(), FCFS(), router=b_router)
    hosts += [await ServiceHost(s, url).start() for s in (b_router, b)]
    await asyncio.sleep(PEER_SILENT_S * 1.5)  # `b` has run for longer than a peer may be silent
    a_router = RouterShell(RouterConfig(policy="least-loaded"))
    a = QueueShell(QueueConfig(), FCFS(), router=a_router)

    async def never_runs() -> None:
        return None

    a._pull_loop = never_runs  # its copy reaches `b` (a fault set-up: no public way)
    a._stats_loop = never_runs  # `a` is not heard yet: its first state is still on its way
    admission = AdmissionShell(AdmissionConfig(), TOK, queue=a)
    hosts += [await ServiceHost(s, url).start() for s in (a_router, a, admission)]
    ids = {w.core.cfg.worker_id for w in workers}
    await until(lambda: ids <= set(a_router.core.view.ids) and ids <= set(a.core.workers)
                and ids <= set(b.core.workers) and ids <= set(admission.core.fleet.workers))
    assert a.instance_id not in b.peers
    client = await TokenyardClient.connect(url)
    try:
        got = await asyncio.wait_for(client.generate(schemas.GenerateRequest(prompt="newcomer", max_tokens=5)), 20)
        assert got.finish_reason == "length" and len(got.token_ids) == 5, got
        assert [k[0] for k in a_router.reask.placed] == [got.request_id]

        async def copy_gone() -> bool:
            return await stream_state(url) == (0, 0)

        async with asyncio.timeout(10):  # deleted by `a` once routed and stored
            while not await copy_gone():
                await asyncio.sleep(0.05)
        await asyncio.sleep(PEER_SILENT_S + TAKEN_RETRY_S)  # past the time `b` leaves it to `a`
        assert not b_router.reask.placed and not b.held and len(b.core) == 0  # placed once, by `a`
    finally:
        await client.close()
        await stop_fleet(hosts)


async def test_a_placed_requests_copy_whose_delete_never_came_is_not_placed_again_by_another_replica(nats_server):
    """Round 12's finding 4: replica `a` placed the request, stored its copy (after the route's
    answer), then died before its delete reached the server. `b` got the copy with its taker
    gone, and placed it a second time while rw0 still ran it. The copy now says it was placed."""
    pair = await start_pair(nats_server.url)
    deletes = []
    pair.a.copies.delete = deletes.append  # the delete never leaves: `a` died between store and delete
    client = await TokenyardClient.connect(nats_server.url)
    rec = Recorder()
    try:
        running = asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt="placed " * 4, max_tokens=600)))
        await until(lambda: rec.tokens() > 0 and not pair.admission.handing_over)  # routed, and its store acked
        rid = rec.events[0].request_id
        assert len(deletes) == 1 and [k[0] for k in pair.a_router.reask.placed] == [rid]
        pair.silence_a()
        state = {}

        async def copy_acked() -> bool:
            state["now"] = await stream_state(nats_server.url)
            return state["now"] == (0, 0)  # acked by `b` (the stream keeps no acked message)

        try:
            async with asyncio.timeout(10):
                while not await copy_acked():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"the copy's stream state: {state}, b placed {dict(pair.b_router.reask.placed)}") from None
        assert not running.done()  # still generating on its worker while `b` had its copy
        await asyncio.wait_for(running, 30)
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 600
        assert not pair.b_router.reask.placed and not pair.b.held  # placed once, by `a`
    finally:
        await client.close()
        await stop_fleet(pair.hosts)
