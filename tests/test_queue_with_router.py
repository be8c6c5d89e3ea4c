"""A router in the queue's process (`tokenyard queue --with-router`, the default of `tokenyard
up`): the queue asks it by a call, so no route request crosses NATS, and the re-ask
guarantees hold as over NATS — an offer a worker left unanswered ends the ask `unsure`, the
queue asks again, and the same worker is offered it first (it answers that it has it)."""

from __future__ import annotations

import asyncio

import pytest
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import TOK, Recorder, stop_fleet, worker


async def start(url: str, workers: list) -> tuple[list[ServiceHost], RouterShell]:
    nc = await natsutil.connect(url, "with-router-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    hosts = [await ServiceHost(w, url).start() for w in workers]
    hosts.append(await ServiceHost(AdmissionShell(AdmissionConfig(), TOK), url).start())
    router = RouterShell(RouterConfig(policy="least-loaded"))
    hosts.append(await ServiceHost(router, url).start())
    hosts.append(await ServiceHost(QueueShell(QueueConfig(), FCFS(), router=router), url).start())
    await until(lambda: router.core.view.n == len(workers))
    return hosts, router


async def routes_returned(hosts: list[ServiceHost]) -> None:
    """Every route call of the queue returned: the router has settled each placement and counted
    its decision. A client's stream can end before that: the worker's answer leaves with the
    stream's first event, but the router reads it on its own connection."""
    queue = hosts[-1].shell
    await until(lambda: queue.kept()["routes"] == 0, what="the queue's route calls to return")


async def test_the_queue_asks_its_router_in_process_and_no_route_request_crosses_nats(nats_server):
    hosts, router = await start(nats_server.url, [worker("lw0"), worker("lw1")])
    nc = await natsutil.connect(nats_server.url, "route-watch")  # the operator: it may watch any subject
    asked_over_nats = []

    async def watch(msg) -> None:
        asked_over_nats.append(msg)

    sub = await nc.subscribe(subjects.ROUTE, cb=watch)
    await nc.flush()
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await asyncio.gather(*(client.generate(schemas.GenerateRequest(prompt=f"local {i}", max_tokens=3))
                                      for i in range(4)))
        assert [d.finish_reason for d in done] == ["length"] * 4
        assert {d.worker_id for d in done} <= {"lw0", "lw1"}
        assert asked_over_nats == []
        await routes_returned(hosts)
        assert len(router.reask.placed) == 4  # every one placed by this router, once
        assert router.metrics.snapshot()["decisions"] == {"least-loaded,routed": 4}
    finally:
        await client.close()
        await sub.unsubscribe()
        await nc.drain()
        await stop_fleet(hosts)


async def test_an_offer_left_unanswered_is_asked_again_of_the_same_worker_and_served_once(nats_server, monkeypatch):
    monkeypatch.setattr(router_shell, "OFFER_TIMEOUT_S", 0.2)
    slow = worker("lw-slow")
    on_generate, offers, late_answers = slow.on_generate, [], []

    async def answer_the_first_offer_late(req) -> None:
        offers.append(codec.decode(req.data, schemas.AdmittedRequest).request_id)
        if len(offers) > 1:
            return await on_generate(req)

        class Late:  # the fault: the worker takes the request, its answer comes after the offer's timeout
            data, headers = req.data, req.headers

            async def respond(self, data: bytes, headers=None) -> None:
                async def late() -> None:
                    await asyncio.sleep(0.6)
                    await req.respond(data, headers=headers)

                late_answers.append(asyncio.create_task(late()))  # the endpoint takes the next offer meanwhile

        await on_generate(Late())

    slow.on_generate = answer_the_first_offer_late
    hosts, router = await start(nats_server.url, [slow])
    client = await TokenyardClient.connect(nats_server.url)
    try:
        rec = Recorder()
        await asyncio.wait_for(rec.run(client, schemas.GenerateRequest(prompt="slow answer " * 8, max_tokens=50)), 30)
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 50, rec.last
        assert rec.seqs() == list(range(len(rec.seqs())))  # one stream, no chunk twice
        rid = rec.last.request_id
        assert offers == [rid, rid]  # asked again (unsure), of the same worker: it had it
        await routes_returned(hosts)
        assert [w for k, w in router.reask.placed.items() if k[0] == rid] == ["lw-slow"]
        assert router.metrics.snapshot()["decisions"] == {"least-loaded,no_capacity": 1, "least-loaded,routed": 1}
    finally:
        await client.close()
        await stop_fleet(hosts)


def test_up_runs_the_router_in_the_queues_process_unless_told_to_run_it_separately():
    from tokenyard import cli
    from tokenyard.launcher import FleetProcesses

    fleet = FleetProcesses(nats_url="nats://x:1", workers=1, router_policy="least-loaded", router_args=["--no-migration"],
                           admission="separate")  # admission in the queue too: tests/test_queue_with_admission.py
    cmds = dict(fleet.commands())
    assert "router" not in cmds
    queue = cmds["queue"]
    assert queue[queue.index("queue"):queue.index("--metrics-port")] == [
        "queue", "--nats", "nats://x:1", "--with-router", "--router-policy", "least-loaded", "--no-migration",
        "--router-metrics-port", str(fleet.metrics_ports["router"])]
    assert set(fleet.scrape_targets()) >= {"queue", "router"}  # each scraped on its own port, as before
    parsed = cli.build_parser().parse_args(queue[queue.index("queue"):])  # the queue's CLI takes them all
    assert (parsed.with_router, parsed.router_policy, parsed.no_migration, parsed.policy) == (
        True, "least-loaded", True, "hybrid")

    separate = dict(FleetProcesses(nats_url="nats://x:1", workers=1, router="separate", metrics=False).commands())
    assert "--with-router" not in separate["queue"] and separate["router"][3:5] == ["router", "--nats"]
    with pytest.raises(ValueError, match="router must be one of"):
        FleetProcesses(nats_url="nats://x:1", router="elsewhere").commands()
