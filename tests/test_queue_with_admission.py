"""Admission in the queue's process (`tokenyard queue --with-admission`, the default of
`tokenyard up`): admission hands each admitted request to the queue by a call; its offer to a
worker leaves first, then its JetStream store with `accepted` right behind it; the queue acks
the stored copy instead of queueing it again. A reused id is answered 409 by admission and the
first request runs on; a failed store ends the stream with an error 503 and nothing runs on;
every stored copy is acked, none is placed twice, not even by another queue replica."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.feed import ProcessFeeds
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import TOK, Recorder, stop_fleet, worker


class Fleet:
    def __init__(self, hosts: list[ServiceHost], admission: AdmissionShell, queue: QueueShell, router: RouterShell):
        self.hosts, self.admission, self.queue, self.router = hosts, admission, queue, router


async def start(url: str, workers: list) -> Fleet:
    nc = await natsutil.connect(url, "with-admission-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    hosts = [await ServiceHost(w, url).start() for w in workers]
    feeds = ProcessFeeds()  # one heartbeat subscription for the three, on the router's connection
    router = RouterShell(RouterConfig(policy="least-loaded"), feeds=feeds)
    queue = QueueShell(QueueConfig(), FCFS(), router=router, feeds=feeds)
    admission = AdmissionShell(AdmissionConfig(), TOK, queue=queue, feeds=feeds)
    for shell in (router, queue, admission):  # as `tokenyard queue --with-router --with-admission` starts them
        hosts.append(await ServiceHost(shell, url).start())
    ids = {w.core.cfg.worker_id for w in workers}
    await until(lambda: ids <= set(router.core.view.ids) and ids <= set(queue.core.workers)
                and ids <= set(admission.core.fleet.workers))
    return Fleet(hosts, admission, queue, router)


def all_routed(queue: QueueShell) -> bool:
    """Nothing of a request kept here: every stored copy that came was acked (`held`), every
    handed-over request routed (`local`), and every route call returned (`routes`) — so the router
    has settled each placement and counted its decision. A client's stream can end before that: the
    worker's answer leaves with the stream's first event, but the router reads it on its own
    connection, and a 3-token stream may reach the client whole before the answer reaches the router."""
    kept = queue.kept()
    return kept["local"] == kept["held"] == kept["routes"] == 0


async def stored(url: str) -> int:
    """Messages left in the queue's stream (a work queue: an acked one is gone)."""
    nc = await natsutil.connect(url, "with-admission-check")
    try:
        return (await nc.jetstream().stream_info(subjects.QUEUE_STREAM)).state.messages
    finally:
        await nc.drain()


async def test_a_request_is_placed_from_admissions_hand_and_its_stored_copy_only_acked(nats_server, monkeypatch):
    # One decision a request is the claim. A worker's answer later than the router's offer timeout
    # (seen under a stalled host: two busy loops beside the suite) is a correct second decision,
    # an unsure round and a re-ask (tests/test_reoffer.py pins that path), not this test's subject.
    monkeypatch.setattr(router_shell, "OFFER_TIMEOUT_S", 30.0)
    fleet = await start(nats_server.url, [worker("aw0"), worker("aw1")])
    taken, take = [], fleet.queue.take

    def counting_take(req, data, headers):
        taken.append((placing := take(req, data, headers)) is not None)
        return placing

    fleet.queue.take = counting_take
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await asyncio.gather(*(client.generate(schemas.GenerateRequest(prompt=f"hand {i}", max_tokens=3))
                                      for i in range(6)))
        assert [d.finish_reason for d in done] == ["length"] * 6
        assert all(d.accepted is not None for d in done)
        assert taken == [True] * 6
        # the streams can end before the router has read its workers' answers (all_routed)
        await until(lambda: all_routed(fleet.queue), what="every copy acked, every route call returned")
        assert await stored(nats_server.url) == 0
        assert len(fleet.queue.core) == 0 and not fleet.queue.core.in_flight
        assert len(fleet.router.reask.placed) == 6  # each placed once: no stored copy was queued again
        assert fleet.router.metrics.snapshot()["decisions"] == {"least-loaded,routed": 6}
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


async def test_a_reused_id_is_answered_409_by_admission_and_the_first_request_runs_on(nats_server):
    fleet = await start(nats_server.url, [worker("aw0")])
    client = await TokenyardClient.connect(nats_server.url)
    rid = f"same-{uuid.uuid4().hex}"  # JetStream remembers ids across a purge: one no other test uses
    try:
        both = await asyncio.gather(*(client.generate(
            schemas.GenerateRequest(prompt=p, max_tokens=4, request_id=rid)) for p in ("one", "two")))
        refused = [d for d in both if d.rejected is not None]
        served = [d for d in both if d.finish_reason == "length"]
        assert len(refused) == 1 and len(served) == 1 and len(served[0].token_ids) == 4
        assert (refused[0].rejected.status, refused[0].rejected.code) == (409, "duplicate_request_id")
        # Again once the first has ended: the queue remembers the id for JetStream's window, so
        # JetStream's duplicate check answers (a rejection, not the worker's error).
        again = await client.generate(schemas.GenerateRequest(prompt="three", max_tokens=4, request_id=rid))
        assert again.rejected is not None and (again.rejected.status, again.rejected.code) == (
            409, "duplicate_request_id"), again
        await until(lambda: all_routed(fleet.queue), what="every route call returned")
        assert [k[0] for k in fleet.router.reask.placed] == [rid]  # placed once
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


async def test_a_failed_store_of_a_waiting_request_takes_it_back_and_ends_its_stream_503(nats_server):
    """No worker takes new requests: the handed request waits in the queue when the store fails."""
    fleet = await start(nats_server.url, [])
    failed = asyncio.Event()

    async def store_fails(verdict, data, headers):
        failed.set()
        raise ConnectionError("the fault: JetStream is gone")

    fleet.admission.store = store_fails
    client = await TokenyardClient.connect(nats_server.url)
    try:
        cfg = fleet.admission.core.cfg
        cfg.slo_check = False  # admitted with no worker, so that it waits in the queue
        got = await asyncio.wait_for(client.generate(schemas.GenerateRequest(prompt="lost", max_tokens=2)), 10)
        assert got.accepted is not None and got.error is not None and got.error.status == 503, got
        assert "queue unavailable" in got.error.message and not got.token_ids
        assert failed.is_set() and len(fleet.queue.core) == 0 and not fleet.queue.core.in_flight
        assert fleet.queue.kept()["local"] == 0
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


async def test_a_failed_store_of_a_request_already_on_a_worker_aborts_it_there_and_ends_its_stream_503(nats_server):
    slow = worker("aw-slow")
    on_worker = asyncio.Event()
    generate = slow.on_generate

    async def noting_generate(req) -> None:
        await generate(req)
        on_worker.set()

    slow.on_generate = noting_generate  # before it serves: the endpoint takes the method then
    fleet = await start(nats_server.url, [slow])

    async def store_fails_once_it_runs(verdict, data, headers):
        async with asyncio.timeout(5):  # the fault: the store's failure comes once the request is on a worker
            await on_worker.wait()
        raise ConnectionError("the fault: JetStream is gone")

    fleet.admission.store = store_fails_once_it_runs
    client = await TokenyardClient.connect(nats_server.url)
    try:
        rec = Recorder()
        await asyncio.wait_for(rec.run(client, schemas.GenerateRequest(prompt="run " * 8, max_tokens=2000)), 10)
        assert isinstance(rec.events[0], schemas.Accepted), rec.events
        assert isinstance(rec.last, schemas.Error) and rec.last.status == 503, rec.events  # its one end
        assert rec.tokens() < 2000
        await until(lambda: not slow.generating)  # the worker stopped it
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


async def test_another_queue_replica_leaves_a_request_to_the_replica_admission_handed_it_to(nats_server):
    """A standby replica pulls from the same stream: the stored copy of a request the first
    replica took from admission's hand may reach it. It hands the copy back to JetStream while
    that replica lives, so no request is placed twice (by two routers, on two workers)."""
    fleet = await start(nats_server.url, [worker("aw0"), worker("aw1")])
    other_router = RouterShell(RouterConfig(policy="least-loaded"))
    other = QueueShell(QueueConfig(), FCFS(), router=other_router)
    fleet.hosts += [await ServiceHost(other_router, nats_server.url).start(),
                    await ServiceHost(other, nats_server.url).start()]
    await until(lambda: fleet.queue.instance_id in other.peers and len(other.core.workers) == 2)
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await asyncio.gather(*(client.generate(schemas.GenerateRequest(prompt=f"pair {i}", max_tokens=2))
                                      for i in range(8)))
        assert [d.finish_reason for d in done] == ["length"] * 8
        await until(lambda: all_routed(fleet.queue) and all_routed(other), timeout_s=15,
                    what="every copy acked, every route call returned")
        assert await stored(nats_server.url) == 0  # every copy came back to its taker and was acked
        assert len(fleet.router.reask.placed) == 8 and not other_router.reask.placed  # each placed once, by its taker
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


def test_up_runs_admission_in_the_queues_process_unless_told_to_run_it_separately():
    from tokenyard import cli
    from tokenyard.launcher import FleetProcesses

    fleet = FleetProcesses(nats_url="nats://x:1", workers=1, tenants=__file__)
    cmds = dict(fleet.commands())
    assert "admission" not in cmds
    queue = cmds["queue"]
    parsed = cli.build_parser().parse_args(queue[queue.index("queue"):])  # the queue's CLI takes them all
    assert (parsed.with_admission, parsed.with_router, parsed.model, parsed.tenants, parsed.admission_metrics_port) == (
        True, True, [fleet.model], __file__, fleet.metrics_ports["admission"])
    assert set(fleet.scrape_targets()) >= {"queue", "router", "admission"}  # each on its own port, as before
    assert fleet.expected()["tokenyard-admission"] == 1  # it still registers as a service of its own

    separate = dict(FleetProcesses(nats_url="nats://x:1", workers=1, admission="separate", metrics=False).commands())
    assert "--with-admission" not in separate["queue"] and separate["admission"][3:5] == ["admission", "--nats"]
    with pytest.raises(ValueError, match="admission must be one of"):
        FleetProcesses(nats_url="nats://x:1", admission="elsewhere").commands()
