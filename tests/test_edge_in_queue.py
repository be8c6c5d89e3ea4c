"""The HTTP edge in the queue's process (`tokenyard queue --with-admission --http-port P`, what
`tokenyard up` runs by default): it hands each request to admission by a call — nothing is
published on `llm.v1.submit` — and gets admission's own answers straight in the stream's inbox.
The answers are those of the NATS path; a client that leaves aborts its generation; a refusal is
a 429 / 503 with Retry-After; two such fronts side by side lose and double no request."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.admission.tenants import TenantTable
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.feed import ProcessFeeds
from tokenyard.shared.service import ServiceHost

from tests.conftest import stop_hosts, until
from tests.fault_fleet import TOK, worker
from tests.test_queue_with_admission import all_routed, stored

MODEL = config.DEFAULT_MODEL


class Front:
    """One `tokenyard queue --with-router --with-admission --http-port 0` process's services."""

    def __init__(self, hosts: list[ServiceHost], router: RouterShell, admission: AdmissionShell, edge: EdgeShell):
        self.hosts, self.router, self.admission, self.edge = hosts, router, admission, edge
        self.url = f"http://127.0.0.1:{edge.port}"


async def start_front(url: str, admission_cfg: AdmissionConfig | None = None) -> Front:
    feeds = ProcessFeeds()
    router = RouterShell(RouterConfig(policy="least-loaded"), feeds=feeds)
    queue = QueueShell(QueueConfig(), FCFS(), router=router, feeds=feeds)
    admission = AdmissionShell(admission_cfg or AdmissionConfig(), TOK, queue=queue, feeds=feeds)
    edge = EdgeShell(EdgeConfig(http_port=0), admission=admission)
    hosts = []
    for shell in (router, queue, admission, edge):  # as services/priority_queue/cli.py starts them
        hosts.append(await ServiceHost(shell, url).start())
    return Front(hosts, router, admission, edge)


async def start(url: str, fronts: int = 1, workers: tuple[str, ...] = ("ew0", "ew1"), prof: str = "a100-llama3-8b",
                admission_cfg: AdmissionConfig | None = None) -> tuple[list[ServiceHost], list[Front]]:
    nc = await natsutil.connect(url, "edge-in-queue-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    hosts = [await ServiceHost(worker(w, prof), url).start() for w in workers]
    out = []
    for _ in range(fronts):
        front = await start_front(url, admission_cfg)
        hosts += front.hosts
        out.append(front)
    for front in out:
        await until(lambda f=front: set(workers) <= set(f.router.core.view.ids)
                    and set(workers) <= set(f.admission.core.fleet.workers), what="every front hears every worker")
    return hosts, out


async def submits_seen(nc) -> list:
    """A plain subscription on `llm.v1.submit`: every request published there (none, in-queue)."""
    seen: list = []

    async def note(msg) -> None:
        seen.append(msg)

    await nc.subscribe(subjects.SUBMIT, cb=note)
    await nc.flush()
    return seen


async def health(front: Front) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(f"{front.url}/health") as r:
        return r.status, await r.json()


async def test_health_is_ready_only_while_the_admission_beside_it_counts_a_worker_up(nats_server):
    """`tokenyard up`'s layout: /health asks the admission in its process by a call, by the rule
    that admission judges every request by — a fleet with no worker up is a 503 no_workers,
    before the first worker and after the last one is gone (it said ok with NATS alone)."""
    hosts, [front] = await start(nats_server.url, workers=())
    try:
        status, body = await health(front)
        assert (status, body["reason"], body["workers_up"], body["workers_known"]) == (503, "no_workers", 0, 0)
        w = await ServiceHost(worker("ewh", "zero"), nats_server.url).start()
        assert await until(lambda: _status(front, 200), what="ready once the worker's heartbeat is heard") == \
            (200, {"status": "ok", "workers_up": 1, "workers_known": 1})
        await w.stop()
        status, body = await until(lambda: _status(front, 503), what="not ready once the worker is gone")
        assert (body["reason"], body["workers_up"], body["workers_known"]) == ("no_workers", 0, 1)
    finally:
        await stop_hosts(hosts)


async def _status(front: Front, want: int) -> tuple[int, dict] | None:
    answer = await health(front)
    return answer if answer[0] == want else None


async def test_the_in_process_edge_answers_as_the_nats_path_and_publishes_no_submit(nats_server):
    hosts, [front] = await start(nats_server.url, prof="zero")
    spy = await natsutil.connect(nats_server.url, "edge-in-queue-spy")
    client = await TokenyardClient.connect(nats_server.url)
    try:
        submits = await submits_seen(spy)
        over_nats = await client.generate(schemas.GenerateRequest(model=MODEL, prompt="the same words", max_tokens=5))
        await until(lambda: len(submits) == 1, what="the spy hears the NATS path's submit (on its own connection, "
                    "so it may come after the answer)")
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{front.url}/v1/completions",
                              json={"model": MODEL, "prompt": "the same words", "max_tokens": 5}) as r:
                plain = (r.status, await r.json())
            async with s.post(f"{front.url}/v1/completions", json={"model": MODEL, "prompt": "the same words",
                                                                   "max_tokens": 5, "stream": True}) as r:
                frames = [line for line in (await r.text()).splitlines() if line.startswith("data: ")]
        assert plain[0] == 200
        choice = plain[1]["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (over_nats.text, "length")
        assert plain[1]["usage"]["completion_tokens"] == len(over_nats.token_ids) == 5
        assert frames[-1] == "data: [DONE]"
        chunks = [json.loads(f.removeprefix("data: "))["choices"][0] for f in frames[:-1]]
        assert "".join(c["text"] for c in chunks) == over_nats.text and chunks[-1]["finish_reason"] == "length"
        await spy.flush()
        assert len(submits) == 1  # neither HTTP request crossed NATS to admission
        await until(lambda: front.admission.metrics.snapshot()["decisions"] == {"admitted": 3},
                    what="all three admitted by the one admission, once each (counted at the store's ack)")
        queue = front.hosts[1].shell
        await until(lambda: queue.kept()["local"] == queue.kept()["held"] == 0, what="every stored copy acked")
        assert await stored(nats_server.url) == 0  # each stored copy acked: nothing runs twice later
    finally:
        await client.close()
        await spy.drain()
        await stop_hosts(hosts)


async def test_a_client_that_leaves_the_in_process_edge_aborts_its_generation(nats_server):
    hosts, [front] = await start(nats_server.url)  # a real profile: 2,000 tokens take a while
    spy = await natsutil.connect(nats_server.url, "edge-in-queue-aborts")
    aborts = await spy.subscribe(subjects.ABORT)
    await spy.flush()
    try:
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{front.url}/v1/completions", headers={"x-request-id": "leaves1"},
                             json={"model": MODEL, "prompt": "a long one", "max_tokens": 2000, "stream": True})
            assert r.status == 200
            assert (await r.content.readline()).startswith(b"data: ")  # the first chunk came
            r.close()  # the client goes
        async with asyncio.timeout(10):
            while (abort := codec.decode((await aborts.next_msg(timeout=10)).data, schemas.Abort)).request_id \
                    != "leaves1":
                pass
        assert abort.reason == "client_cancelled"
        workers = [h.shell for h in hosts if h.shell.kind == "worker"]
        await until(lambda: not any(w.generating for w in workers), what="the generation stopped on its worker")
    finally:
        await spy.drain()
        await stop_hosts(hosts)


async def test_a_refusal_by_the_in_process_admission_is_a_503_with_retry_after(nats_server):
    table = TenantTable(global_rate_tokens_per_s=5.0, global_burst_tokens=50.0)
    hosts, [front] = await start(nats_server.url, prof="zero", admission_cfg=AdmissionConfig(tenants=table))
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "a" * 24, "max_tokens": 16}
            async with s.post(f"{front.url}/v1/completions", json=body) as r:
                assert r.status == 200
            for stream in (False, True):  # the bucket is empty: refused before any byte of a stream
                async with s.post(f"{front.url}/v1/completions", json={**body, "stream": stream}) as r:
                    refusal = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["code"])
                assert refusal[0] == 503 and refusal[2] == "overloaded"
                assert float(refusal[1]) > 0
    finally:
        await stop_hosts(hosts)


async def test_two_fronts_side_by_side_lose_and_double_no_request(nats_server):
    """Two `up`-style front processes (edge, admission, queue and router each) on one bus: each
    request sent to either runs once, on one worker, and every stored copy is acked."""
    hosts, fronts = await start(nats_server.url, fronts=2, prof="zero")
    workers = [h.shell for h in hosts if h.shell.kind == "worker"]
    try:
        async with aiohttp.ClientSession() as s:
            async def one(i: int) -> tuple[int, str]:
                front = fronts[i % 2]
                async with s.post(f"{front.url}/v1/completions", headers={"x-request-id": f"pair-{i}"},
                                  json={"model": MODEL, "prompt": f"pair {i}", "max_tokens": 3}) as r:
                    return r.status, (await r.json())["choices"][0]["finish_reason"]

            done = await asyncio.gather(*(one(i) for i in range(24)))
        assert done == [(200, "length")] * 24
        for f in fronts:  # every store ended (a request is routed before its store begins); every
            q = f.hosts[1].shell  # route call returned: a response can end before its router has read the worker's answer
            await until(lambda q=q, f=f: all_routed(q) and not f.admission.handing_over, timeout_s=15, what="every request routed and its store acked")
        placed = [{key[0] for key in f.router.reask.placed} for f in fronts]
        assert placed[0] | placed[1] == {f"pair-{i}" for i in range(24)}
        assert not placed[0] & placed[1]  # no request placed by both
        assert len(placed[0]) == 12 and len(placed[1]) == 12  # each by the front it came to

        async def none_left() -> bool:  # a routed request's copy is deleted once its store's ack comes
            return await stored(nats_server.url) == 0

        await until(none_left, timeout_s=15, what="every stored copy acked or deleted")
        assert sum(sum(w.metrics.snapshot()["finished"].values()) for w in workers) == 24  # each generated once
    finally:
        await stop_hosts(hosts)


def test_up_runs_the_edge_in_the_queues_process_unless_given_edge_processes():
    from tokenyard import cli
    from tokenyard.launcher import FleetProcesses

    fleet = FleetProcesses(nats_url="nats://x:1", workers=1, http_port=8123)
    cmds = dict(fleet.commands())
    assert not any(name.startswith("edge") for name in cmds)
    queue = cmds["queue"]
    parsed = cli.build_parser().parse_args(queue[queue.index("queue"):])
    assert (parsed.with_admission, parsed.http_port, parsed.model) == (True, 8123, [fleet.model])
    assert fleet.expected()["tokenyard-edge"] == 1  # it still registers as a service of its own
    assert fleet.scrape_targets()["edge"] == "http://127.0.0.1:8123/metrics"

    own = dict(FleetProcesses(nats_url="nats://x:1", workers=1, http_port=8123, edge_processes=2).commands())
    assert {"edge-0", "edge-1"} <= set(own) and "--http-port" not in own["queue"]
    alone = FleetProcesses(nats_url="nats://x:1", workers=1, admission="separate")
    assert alone.edge_count == config.edge_processes() and "--http-port" not in dict(alone.commands())["queue"]


def test_queue_refuses_an_http_port_without_admission_in_its_process():
    from tokenyard import cli

    args = cli.build_parser().parse_args(["queue", "--http-port", "0"])
    with pytest.raises(SystemExit, match="--http-port needs --with-admission"):
        args.func(args)
