"""The fault suite over a real nats-server, each probe small and fast (bench/faults/ runs
the heavy versions with real processes and SIGKILL):

* a worker dies mid-stream: with migration every stream completes with no gap and no
  repeat; with migration off each of its streams ends with a clean 503 within 5 s;
* a reused request id gets 409 (from admission inside JetStream's dedup window, from the
  worker after it), the first request runs on; the same request asked for again (an offer's
  answer or a route's answer lost) is served once, with no 409 and no deadline rejection;
* a gap in a stream, or a silent stream, ends with an error, never a short `finished`;
* a client that vanishes (no abort, its lease lapses) has its generation aborted;
* while no router runs, the queue backs off instead of spinning, and serves once one is back;
* a router crash loses nothing (a standby routes what was queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue import shell as queue_shell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import client as client_module
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import until

TOK = ByteTokenizer()


def worker(wid: str, prof: str = "a100-llama3-8b") -> WorkerShell:
    return WorkerShell(WorkerConfig(wid, config.DEFAULT_MODEL), SimEngine(SimEngineCore(profile(prof), 16)), TOK)


async def start_fleet(url: str, workers: int = 2, migration: MigrationConfig | None = None,
                      router: bool = True) -> list[ServiceHost]:
    nc = await natsutil.connect(url, "fault-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    hosts = [await ServiceHost(worker(f"fw{i}"), url).start() for i in range(workers)]
    hosts.append(await ServiceHost(AdmissionShell(AdmissionConfig(), TOK), url).start())
    hosts.append(await ServiceHost(QueueShell(QueueConfig(), FCFS()), url).start())
    if router:
        hosts.append(await ServiceHost(RouterShell(RouterConfig(policy="least-loaded"), migration=migration), url).start())
        shell = hosts[-1].shell
        await until(lambda: shell.core.view.n >= workers)
    return hosts


async def stop_fleet(hosts: list[ServiceHost]) -> None:
    for h in reversed(hosts):
        await h.stop()


async def crash_worker(host: ServiceHost) -> None:
    """Die without a word, as a SIGKILL would: the connection goes, nothing is finished."""
    shell = host.shell
    host._stopped.set()  # its host's stop() is a no-op from now on
    for t in shell._timers:
        t.cancel()
    await host.nc.close()
    for t in list(shell._streams.values()):
        t.cancel()
    await shell.engine.stop()


class Recorder:
    """One stream's events as the client hands them on."""

    def __init__(self) -> None:
        self.events: list = []
        self.first_chunk = asyncio.Event()
        self.end_s = 0.0

    async def run(self, client: TokenyardClient, req: schemas.GenerateRequest) -> None:
        async for e in client.stream(req):
            self.events.append(e)
            if isinstance(e, schemas.Chunk):
                self.first_chunk.set()
        self.end_s = time.monotonic()

    @property
    def last(self):
        return self.events[-1]

    def seqs(self) -> list[int]:
        return [e.seq for e in self.events if isinstance(e, schemas.Chunk)]

    def tokens(self) -> int:
        return sum(len(e.token_ids) for e in self.events if isinstance(e, schemas.Chunk))


async def start_streams(url: str, n: int, max_tokens: int):
    nc = await natsutil.connect(url, "fault-client")
    client = TokenyardClient(nc)
    recs = [Recorder() for _ in range(n)]
    tasks = [
        asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt=f"stream {i} " * 8, max_tokens=max_tokens)))
        for i, rec in enumerate(recs)
    ]
    async with asyncio.timeout(20):
        await asyncio.gather(*(r.first_chunk.wait() for r in recs))
    return nc, client, recs, tasks


async def test_a_dead_workers_streams_complete_by_migration_without_gap_or_repeat():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url)
    try:
        router = hosts[-1].shell
        nc, client, recs, tasks = await start_streams(server.url, 12, 150)
        victim = hosts[0]
        moved = set(victim.shell.core.running_ids())
        assert moved, "the victim runs some of the streams"
        await crash_worker(victim)
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        for rec in recs:
            assert isinstance(rec.last, schemas.Finished) and rec.last.finish_reason == "length", rec.last
            assert rec.seqs() == list(range(len(rec.seqs())))  # no gap, no repeat
            assert rec.tokens() == 150 and rec.last.usage.completion_tokens == 150
            assert rec.last.seq == len(rec.seqs())
        assert {r.last.worker_id for r in recs} == {"fw1"}  # the survivor finished all of them
        assert router.migration.migrated == len(moved) and router.migration.failed == 0
        assert router.migration.tracked == {} and router._follows == {}
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_with_migration_off_a_dead_workers_streams_end_with_a_503_within_5_s():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, migration=MigrationConfig(enabled=False))
    try:
        nc, client, recs, tasks = await start_streams(server.url, 8, 300)
        victim = hosts[0]
        lost = set(victim.shell.core.running_ids())
        assert lost
        t0 = time.monotonic()
        await crash_worker(victim)
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        for rec in recs:
            rid = rec.events[0].request_id
            if rid in lost:
                assert isinstance(rec.last, schemas.Error) and rec.last.status == 503, rec.last
                assert "migration is off" in rec.last.message
                assert rec.end_s - t0 < 5.0
                assert rec.seqs() == list(range(len(rec.seqs())))
            else:
                assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 300
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_request_whose_offer_answer_came_late_is_served_once_without_a_409(monkeypatch):
    """The worker takes the request, but its answer reaches the router after the offer
    timeout (a worker cold-starting under load: bench/faults' queue-kill). The router's
    placement ends `unsure`, the queue asks again, the worker says it has it: one complete
    stream. Before: `no_capacity`, the queue routed it again, and the worker answered the
    same request with the reused-id 409 (63 of 1,200 in queue-kill)."""
    monkeypatch.setattr(router_shell, "OFFER_TIMEOUT_S", 0.3)
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=0, router=False)
    try:
        slow = worker("fw-slow")
        answer, generate, late, offers, generations = slow._on_generate, slow._generate, [], [], []

        async def counted(ar, *args) -> None:
            generations.append(ar.request_id)
            await generate(ar, *args)

        async def answer_the_first_offer_late(req) -> None:
            offers.append(req)
            if late:
                return await answer(req)

            class Late:  # the fault: this answer takes longer than the router waits
                data, headers = req.data, req.headers

                async def respond(self, data: bytes, headers=None) -> None:
                    await asyncio.sleep(0.6)
                    await req.respond(data, headers=headers)

            late.append(req)
            await answer(Late())

        slow._on_generate, slow._generate = answer_the_first_offer_late, counted
        hosts.insert(0, await ServiceHost(slow, server.url).start())
        hosts.append(await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start())
        await until(lambda: hosts[-1].shell.core.view.n == 1)
        nc, client, recs, tasks = await start_streams(server.url, 1, 200)
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        rec = recs[0]
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 200, rec.last
        assert rec.seqs() == list(range(len(rec.seqs())))
        assert not any(isinstance(e, schemas.Error) for e in rec.events)
        assert len(offers) >= 2 and len(generations) == 1  # asked again; generated once
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_placed_request_whose_route_answer_was_lost_is_not_expired_by_the_queue(monkeypatch):
    """The router places the request (its worker streams it) but its `routed` reaches the
    queue after the route timeout (lost in a NATS outage: bench/faults' nats-restart), past
    the request's TTFT deadline. The queue asks again instead of putting it back, the router
    answers `routed` from its placement, and the stream completes. Before: back in line,
    and `expire` ended a stream that a worker was sending with a 429 deadline_exceeded."""
    monkeypatch.setattr(queue_shell, "ROUTE_TIMEOUT_S", 0.3)
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1, router=False)
    try:
        router = RouterShell(RouterConfig(policy="least-loaded"))
        route, asks = router._route, []

        async def answer_the_first_ask_late(req) -> None:
            asks.append(req)
            if len(asks) > 1:
                return await route(req)

            class Late:  # the fault: the answer comes after the queue stopped waiting
                data, headers = req.data, req.headers

                async def respond(self, data: bytes, headers=None) -> None:
                    await asyncio.sleep(1.0)
                    await req.respond(data, headers=headers)

                async def respond_error(self, *args, **kwargs) -> None:
                    await req.respond_error(*args, **kwargs)

            await route(Late())

        router._route = answer_the_first_ask_late
        hosts.append(await ServiceHost(router, server.url).start())
        await until(lambda: router.core.view.n == 1)
        nc = await natsutil.connect(server.url, "fault-client")
        client = TokenyardClient(nc)
        rec = Recorder()
        # a 0.4 s TTFT target: its deadline passes while the queue waits for the lost answer
        await asyncio.wait_for(rec.run(client, schemas.GenerateRequest(
            prompt="placed " * 8, max_tokens=100, ttft_slo_ms=400.0)), 30)
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 100, rec.last
        assert len(asks) >= 2  # asked again, answered from the placement
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_reused_request_id_gets_409_and_the_first_request_runs_on(fleet):
    client = TokenyardClient(fleet.nats)
    both = await asyncio.gather(*(
        client.generate(schemas.GenerateRequest(prompt=p, max_tokens=4, request_id="same")) for p in ("one", "two")
    ))
    refused = [d for d in both if d.rejected is not None]
    served = [d for d in both if d.finish_reason == "length"]
    assert len(refused) == 1 and len(served) == 1
    assert (refused[0].rejected.status, refused[0].rejected.code) == (409, "duplicate_request_id")
    assert refused[0].accepted is None and len(served[0].token_ids) == 4
    again = await client.generate(schemas.GenerateRequest(prompt="three", max_tokens=4, request_id="same"))
    assert again.rejected is not None and again.rejected.status == 409
    await client.close()


async def test_a_worker_answers_an_id_reused_past_the_dedup_window_with_409(fleet):
    """Past JetStream's window the queue would route a reused id again; the worker that ran
    the first one answers the newcomer's inbox with an error instead of leaving it waiting."""
    nc = fleet.nats
    client = TokenyardClient(nc)
    done = await client.generate(schemas.GenerateRequest(prompt="first", max_tokens=2, request_id="old-id"))
    wid = done.worker_id
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    ar = schemas.AdmittedRequest("old-id", inbox, config.DEFAULT_MODEL, [1, 2], 2, [], 16, 2, 1, time.time())
    reply = codec.decode((await nc.request(subjects.worker_generate(wid), codec.encode(ar), timeout=5)).data,
                         schemas.GenerateReply)
    assert reply.accepted and reply.reason == schemas.Outcome.DUPLICATE
    event = codec.decode_event((await sub.next_msg(timeout=5)).data)
    assert isinstance(event, schemas.Error) and event.status == 409
    await sub.unsubscribe()
    await client.close()


async def _fake_admission(nc, events) -> None:
    """Answer every submit with the given events, in order."""

    async def answer(msg) -> None:
        for e in events:
            await nc.publish(msg.reply, codec.encode(e))

    await nc.subscribe(subjects.SUBMIT, queue=subjects.GROUP_ADMISSION, cb=answer)


async def test_a_gap_in_the_stream_is_an_error_not_a_short_finish(monkeypatch):
    monkeypatch.setattr(client_module, "GAP_WAIT_S", 1.0)  # the shipped wait is 15 s
    server = await natsutil.NatsServer().start()
    try:
        nc = await natsutil.connect(server.url, "fake")
        usage = schemas.Usage(3, 3, 6)
        await _fake_admission(nc, [schemas.Accepted("g", 1, 3), schemas.Chunk("g", 0, "a", [97]),
                                   schemas.Chunk("g", 2, "c", [99]), schemas.Finished("g", 3, "length", usage)])
        out = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="x", request_id="g"))
        assert out.finish_reason is None and out.error is not None and out.error.status == 502
        assert out.text == "a"
        await nc.drain()
    finally:
        server.stop()


async def test_a_silent_stream_ends_with_an_error_after_the_idle_timeout():
    server = await natsutil.NatsServer().start()
    try:
        nc = await natsutil.connect(server.url, "fake")
        aborts: list[str] = []


        async def on_abort(msg) -> None:
            aborts.append(codec.decode(msg.data, schemas.Abort).reason)

        await nc.subscribe(subjects.ABORT, cb=on_abort)
        await _fake_admission(nc, [schemas.Accepted("s", 1, 3), schemas.Chunk("s", 0, "a", [97])])
        out = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="x", request_id="s"), idle_timeout_s=0.3)
        assert out.error is not None and out.error.status == 504 and out.text == "a"
        await nc.flush()
        await until(lambda: aborts == ["client_idle_timeout"])
        await nc.drain()
    finally:
        server.stop()


async def test_a_vanished_clients_generation_is_aborted():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1)
    try:
        gone = await natsutil.connect(server.url, "doomed-client")
        client = TokenyardClient(gone)
        rec = Recorder()
        task = asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt="long", max_tokens=5000)))
        await asyncio.wait_for(rec.first_chunk.wait(), 20)
        w = hosts[0].shell
        assert len(w.core.running_ids()) == 1
        client._lease_task.cancel()  # the client dies: no abort, no more lease
        await gone.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        t0 = time.monotonic()
        await until(lambda: not w.core.streams, timeout_s=10)
        assert time.monotonic() - t0 < 6.0  # orphan_after_s (3 s) + a tick, not the 5000 tokens
        assert w.engine.stats().running == 0  # the engine stopped it too, not only the worker's bookkeeping
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_the_queue_backs_off_while_no_router_runs_and_serves_once_one_is_back():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1, router=False)
    try:
        queue = next(h.shell for h in hosts if isinstance(h.shell, QueueShell))
        nc = await natsutil.connect(server.url, "client")
        client = TokenyardClient(nc)
        pending = [asyncio.create_task(client.generate(schemas.GenerateRequest(prompt=f"q{i}", max_tokens=2)))
                   for i in range(5)]
        await until(lambda: queue.route_failures >= 5)
        t0 = time.monotonic()
        await asyncio.sleep(2.0)  # a window to count retries in, not to order events
        failures = queue.route_failures
        # without backoff: 5 requests every 50 ms ≈ 200 in 2 s
        assert failures <= 5 + 5 * 3, f"{failures} route attempts in {time.monotonic() - t0:.1f} s"
        assert queue.router_down_backoff_s == 2.0
        hosts.append(await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start())
        done = await asyncio.wait_for(asyncio.gather(*pending), 15)
        assert [d.finish_reason for d in done] == ["length"] * 5
        assert queue.router_down_backoff_s == 0.0
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_a_router_crash_loses_no_queued_request():
    """The router holds no request: one that dies leaves the queue's unrouted requests to a
    standby replica (the queue retries on no answer), and the streams it placed run on."""
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1)
    try:
        standby = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start()
        hosts.append(standby)
        nc = await natsutil.connect(server.url, "client")
        client = TokenyardClient(nc)
        first = hosts[-2]
        pending = [asyncio.create_task(client.generate(schemas.GenerateRequest(prompt=f"r{i}", max_tokens=20)))
                   for i in range(20)]
        await until(lambda: first.shell.migration.tracked)
        first._stopped.set()
        for t in (first.shell._housekeeping, first.shell._monitor):
            t.cancel()
        await first.nc.close()
        done = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert [(d.finish_reason, d.error) for d in done] == [("length", None)] * 20
        assert all(len(d.token_ids) == 20 for d in done)
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_over_http_a_reused_x_request_id_is_a_409_with_an_openai_body(fleet):
    import aiohttp
    from tokenyard.services.edge.shell import EdgeConfig, EdgeShell

    host = await ServiceHost(EdgeShell(EdgeConfig(http_port=0)), fleet.nats_url).start()
    try:
        url = f"http://127.0.0.1:{host.shell.port}/v1/completions"
        body = {"model": config.DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body, headers={"x-request-id": "http-same"}) as r:
                assert r.status == 200
                await r.read()
            async with http.post(url, json=body, headers={"x-request-id": "http-same"}) as r:
                assert r.status == 409
                err = (await r.json())["error"]
        assert err["code"] == "duplicate_request_id" and "http-same" in err["message"]
    finally:
        await host.stop()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_streams_survive_a_nats_server_restart_by_replay_or_end_cleanly(tmp_path):
    """nats-server stops for 2 s mid-stream and comes back on the same port and store: the
    services reconnect, the worker replays what it sent meanwhile, and every stream ends
    with all its tokens (or, at worst, a clean error), never a short `finished`."""
    import subprocess

    port = natsutil.free_port()
    cmd = [natsutil.nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path)]

    async def serve() -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        async with asyncio.timeout(10):
            while True:
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    return proc
                except OSError:
                    await asyncio.sleep(0.05)

    server = await serve()
    url = f"nats://127.0.0.1:{port}"
    hosts = await start_fleet(url, workers=1)
    try:
        nc, client, recs, tasks = await start_streams(url, 4, 300)
        server.terminate()
        server.wait(5)
        await asyncio.sleep(2.0)  # the outage itself
        server = await serve()
        async with asyncio.timeout(40):
            await asyncio.gather(*tasks)
        for rec in recs:
            assert rec.seqs() == list(range(len(rec.seqs())))
            if isinstance(rec.last, schemas.Finished):
                assert rec.tokens() == 300
            else:
                assert isinstance(rec.last, schemas.Error)
        assert sum(isinstance(r.last, schemas.Finished) for r in recs) == 4, [r.last for r in recs]
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.terminate()
        server.wait(5)
