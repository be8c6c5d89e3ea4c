"""One subscription per process for the fan-out subjects (shared/feed.py), and the idle loops
that wake only when there is work: the worker's KV poll, the router's migration tick, the
queue's unchanged state."""

from __future__ import annotations

import asyncio
import functools

from tokenyard.services.priority_queue.state_gate import UNCHANGED_STATS_S, StatsGate
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.feed import Feed, ProcessFeeds
from tokenyard.shared.service import ServiceHost

from tests.builders import hb
from tests.conftest import until
from tests.fault_fleet import worker


def test_a_message_reaches_every_listener_in_join_order_even_past_one_that_raises():
    feed: Feed[schemas.Heartbeat] = Feed(subjects.HEARTBEAT_ALL, schemas.Heartbeat)
    got: list[tuple[str, str, float]] = []

    def broken(_hb, _now):
        raise RuntimeError("a listener's bug")

    feed.listeners += [lambda h, now: got.append(("a", h.worker_id, now)), broken,
                       lambda h, now: got.append(("b", h.worker_id, now))]
    feed.deliver(hb("w1"), 12.5)
    assert got == [("a", "w1", 12.5), ("b", "w1", 12.5)]


async def test_the_feed_is_connected_while_its_first_joiners_connection_is(plain_nats):
    """Admission hears heartbeats on the router's connection: its liveness must not count a
    silence while that connection is down, though its own is up (it checks `connected`)."""
    first = await natsutil.connect(plain_nats.url, "feed-first")
    second = await natsutil.connect(plain_nats.url, "feed-second")
    feed: Feed[schemas.Heartbeat] = Feed(subjects.HEARTBEAT_ALL, schemas.Heartbeat)
    assert not feed.connected  # nobody subscribed: nothing can be heard
    try:
        await feed.join(first, lambda h, now: None)
        await feed.join(second, lambda h, now: None)
        assert feed.connected
        await first.close()
        assert not feed.connected and second.is_connected
    finally:
        await second.drain()


async def test_three_connections_share_one_subscription_and_each_listener_gets_each_beat_once(plain_nats):
    ncs = [await natsutil.connect(plain_nats.url, f"feed-{i}") for i in range(3)]
    pub = await natsutil.connect(plain_nats.url, "feed-pub")
    feeds = ProcessFeeds()
    got: dict[int, list[str]] = {0: [], 1: [], 2: []}
    try:
        for i, nc in enumerate(ncs):
            await feeds.heartbeats.join(nc, lambda h, _now, i=i: got[i].append(h.worker_id))
            await nc.flush()
        await pub.publish(subjects.heartbeat("w1"), codec.encode(hb("w1")))
        await pub.publish(subjects.heartbeat("w2"), b"\xc1 not msgpack")
        await pub.publish(subjects.heartbeat("w3"), codec.encode(hb("w3")))
        await until(lambda: len(got[2]) == 2, what="both good heartbeats")
        assert got == {0: ["w1", "w3"], 1: ["w1", "w3"], 2: ["w1", "w3"]}
        assert feeds.heartbeats.bad == 1
        # nats-server sent them to the first joiner's connection only
        assert [nc.stats["in_msgs"] for nc in ncs] == [3, 0, 0]
    finally:
        for nc in [*ncs, pub]:
            await nc.drain()


def test_an_unchanged_queue_state_is_repeated_only_every_unchanged_stats_s():
    gate = StatsGate()
    idle = schemas.QueueStats("q1", ts=0.0, policy="fcfs", depth=[0, 0, 0, 0], work_tokens=[0, 0, 0, 0])
    at = [round(0.1 * i, 1) for i in range(12)]
    sent = [t for t in at if gate.due(_at(idle, t), t)]
    assert sent == [0.0, 0.3, 0.6, 0.9]  # the first, then every UNCHANGED_STATS_S (0.3 s)
    assert UNCHANGED_STATS_S == 0.3
    busy = _at(idle, 1.0)
    busy.depth = [0, 1, 0, 0]
    assert gate.due(busy, 1.0)  # a change goes out at once
    assert not gate.due(_at(busy, 1.1), 1.1)
    assert gate.due(_at(idle, 1.2), 1.2)  # and so does the change back


def _at(stats: schemas.QueueStats, ts: float) -> schemas.QueueStats:
    out = schemas.QueueStats(**{f: getattr(stats, f) for f in stats.__struct_fields__})
    out.ts, out.depth = ts, list(stats.depth)
    return out


async def test_an_idle_workers_kv_events_still_go_out_with_its_heartbeat(plain_nats):
    """The KV poll sleeps while nothing runs; an event made then (a prefix-cache reset) goes
    out with the next heartbeat (before the change, nothing sent it until a generation ran)."""
    w = worker("kvidle")
    host = await ServiceHost(w, plain_nats.url).start()
    nc = await natsutil.connect(plain_nats.url, "kv-watch")
    seen: list[str] = []
    try:
        await nc.subscribe(subjects.kv_events("kvidle"), cb=functools.partial(_note, seen, "kv"))
        await nc.subscribe(subjects.heartbeat("kvidle"), cb=functools.partial(_note, seen, "hb"))
        await nc.flush()
        await until(lambda: "hb" in seen, what="a heartbeat")
        assert not w.generating and not w.kv_poll_awake  # idle: the KV poll waits
        seen.clear()
        w.engine.core.pool.clear()  # nothing cached: AllBlocksCleared
        await until(lambda: "kv" in seen, what="the idle worker's KV event")
        assert not w.kv_poll_awake  # it went out without waking the poll
    finally:
        await nc.drain()
        await host.stop()


async def _note(seen: list[str], what: str, _msg) -> None:
    seen.append(what)
    await asyncio.sleep(0)
