"""Fault probes over a real nats-server (bench/faults/ runs the heavy versions with real
processes and SIGKILL): a service or the server dies and nothing admitted is lost.

* a worker dies mid-stream: with migration every stream completes with no gap and no
  repeat; with migration off each of its streams ends with a clean 503 within 5 s;
* while no router runs, the queue backs off instead of spinning, and serves once one is back;
* a router crash loses nothing (a standby routes what was queued);
* streams survive a nats-server restart by replay, or end cleanly.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import crash_worker, start_fleet, start_streams, stop_fleet


@pytest.mark.parametrize("tapped", [False, True], ids=["subscribed", "tapped"])
async def test_a_dead_workers_streams_complete_by_migration_without_gap_or_repeat(tapped):
    """Followed by subscriptions (a client elsewhere), or by taps on a client in the router's
    process (the edge beside it in `tokenyard up`): the router reads the same events either way."""
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url)
    try:
        router = hosts[-1].shell
        nc, client, recs, tasks = await start_streams(server.url, 12, 150, tapped_by=router if tapped else None)
        assert router.following and all(router.follows.tapped(rid) == tapped for rid in router.following)
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
        assert client.resumes == 0  # the router lives and moved them first: the client re-issues nothing
        # the router hears each stream's end a moment after its client does
        await until(lambda: router.migration.tracked == {} and router.following == [],
                    what="the router forgets the finished streams")
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
        assert client.resumes == 0  # the router that placed them lives and ended them: not the client's to move
        await client.close()
        await nc.drain()
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
        first._stopped.set()  # an in-process SIGKILL: no public way to die without a word
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
