"""`tokenyard up --nats-cluster 3`: three nats-servers clustered over loopback routes, the queue
stream and the topology bucket replicated R3, every service given every node's URL. One node
is SIGKILLed while 30 streams run: all 30 complete with every chunk, once and in order; 10 more
submitted right after the kill (while JetStream elects new leaders) complete too; the stream
keeps R3."""

from __future__ import annotations

import asyncio

import pytest
from tokenyard.shared import natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.nats_cluster import NatsCluster

from tests.conftest import until
from tokenyard.launcher import FleetProcesses, ping

STREAMS = 30
MAX_TOKENS = 96


async def leader_of(nc) -> str | None:
    """The queue stream's leader, None while JetStream has none to answer for it."""
    try:
        info = await nc.jetstream(timeout=2.0).stream_info(subjects.QUEUE_STREAM)
    except Exception:  # no leader yet: the request times out, or is answered with an error
        return None
    return info.cluster.leader if info.cluster else None


async def test_cluster_forms_and_replicates_three_ways():
    async with NatsCluster(3) as cluster:
        assert len(cluster.urls) == 3 and cluster.url.count(",") == 2
        nc = await natsutil.connect(cluster.url, "test")
        try:
            assert natsutil.cluster_replicas(nc) == 3
            await natsutil.ensure_queue_stream(nc)
            kv = await natsutil.topology_bucket(nc)
            info = await nc.jetstream().stream_info(subjects.QUEUE_STREAM)
            assert info.config.num_replicas == 3
            assert info.cluster.name == "tokenyard" and len(info.cluster.replicas) == 2  # leader + 2
            assert (await kv.status()).stream_info.config.num_replicas == 3
        finally:
            await nc.close()


async def test_single_server_keeps_one_replica(nats_server):
    nc = await natsutil.connect(nats_server.url, "test")
    try:
        assert natsutil.cluster_replicas(nc) == 1
    finally:
        await nc.close()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_node_sigkilled_under_30_streams_all_complete(tmp_path):
    fleet = FleetProcesses(workers=2, profile="a100-llama3-8b", http_port=0, nats_cluster=3,
                           log_dir=str(tmp_path), metrics=False)
    await fleet.start()
    cluster = fleet.server
    assert isinstance(cluster, NatsCluster)
    try:
        # The queue stream's leader is the node to kill: its loss is the hard case (no JetStream
        # answer until the peers elect another). The test client sits on another node: it stands
        # for users, whose connections are elsewhere.
        probe = await natsutil.connect(fleet.nats_url, "probe")
        leader = (await probe.jetstream().stream_info(subjects.QUEUE_STREAM)).cluster.leader
        await probe.close()
        victim = int(leader.rsplit("n", 1)[1])
        nc = await natsutil.connect(cluster.urls[(victim + 1) % 3], "test")
        assert await ping(nc) == fleet.expected()
        client = TokenyardClient(nc)
        started = asyncio.Event()
        first_chunks = 0

        async def one(i: int) -> tuple[str, list[int]]:
            nonlocal first_chunks
            seqs: list[int] = []
            # A TTFT deadline the failover fits in: the queue rejects a request past its deadline
            # (P1's 5 s by default), and this test is about losing none, not about latency.
            req = schemas.GenerateRequest(prompt=f"stream {i} " * 20, max_tokens=MAX_TOKENS, ignore_eos=True,
                                          ttft_slo_ms=120_000)
            async for event in client.stream(req, idle_timeout_s=60.0):
                if isinstance(event, schemas.Chunk):
                    if not seqs:
                        first_chunks += 1
                        if first_chunks == STREAMS // 2:
                            started.set()
                    seqs.append(event.seq)
                elif isinstance(event, schemas.Finished):
                    return "finished", seqs
                elif isinstance(event, schemas.Rejected | schemas.Error):
                    return f"{type(event).__name__}: {event}", seqs
            return "no terminal event", seqs

        tasks = [asyncio.create_task(one(i)) for i in range(STREAMS)]
        await asyncio.wait_for(started.wait(), 60)  # half the streams are producing tokens
        cluster.kill(victim)
        tasks += [asyncio.create_task(one(STREAMS + i)) for i in range(10)]
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)

        outcomes = [r for r, _ in results]
        assert outcomes == ["finished"] * (STREAMS + 10), outcomes
        for _, seqs in results:  # every chunk of every stream, once, in order
            assert seqs == list(range(MAX_TOKENS))
        assert cluster.live() == 2
        # A service that connects now sees two nodes, and must not scale the stream down.
        nc2 = await natsutil.connect(fleet.nats_url, "late-service")
        # The streams above need not have waited for the stream's new leader (admission hands a
        # request to the queue in its process while JetStream stores it): wait for one here.
        await until(lambda: leader_of(nc2), timeout_s=90)
        await natsutil.ensure_queue_stream(nc2)
        info = await nc2.jetstream().stream_info(subjects.QUEUE_STREAM)
        assert info.config.num_replicas == 3
        await nc2.close()
        # The fleet still serves.
        done = await client.generate(schemas.GenerateRequest(prompt="after", max_tokens=4))
        assert done.finish_reason == "length"
        await nc.drain()
    finally:
        await fleet.stop()
