"""A process's shared Feed (shared/feed.py) when a service sharing it stops, or stops and
starts again, on a real nats-server: the subscription moves to a service still listening,
and a service started again hears each heartbeat once."""

from __future__ import annotations

from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.feed import Feed, ProcessFeeds
from tokenyard.shared.service import ServiceHost

from tests.builders import hb
from tests.conftest import until


async def _beat(nc, wid: str) -> None:
    await nc.publish(subjects.heartbeat(wid), codec.encode(hb(wid, ts=0.0)))
    await nc.flush()


async def test_a_router_stopped_and_started_again_on_the_shared_feed_hears_heartbeats(plain_nats):
    """`tokenyard queue --with-router`'s feeds, the router stopped and a new one started in the
    same process (its host's connection is new). Main: the feed kept its subscription on the
    first router's closed connection, so the new router never heard a worker."""
    feeds = ProcessFeeds()
    pub = await natsutil.connect(plain_nats.url, "feed-restart-pub")
    first = await ServiceHost(RouterShell(RouterConfig(), feeds=feeds), plain_nats.url).start()
    await _beat(pub, "fw0")
    await until(lambda: "fw0" in first.shell.core.view.ids, what="the first router hears fw0")
    await first.stop()
    again = await ServiceHost(RouterShell(RouterConfig(), feeds=feeds), plain_nats.url).start()
    try:
        await _beat(pub, "fw1")
        await until(lambda: "fw1" in again.shell.core.view.ids, timeout_s=3, what="the new router hears fw1")
        assert "fw1" not in first.shell.core.view.ids  # the stopped one has left
        assert feeds.heartbeats.listeners == [again.shell.on_heartbeat]
    finally:
        await again.stop()
        await pub.drain()
    assert feeds.heartbeats.subscription is None and not feeds.heartbeats.listeners


async def test_the_queue_keeps_hearing_heartbeats_when_the_router_whose_connection_held_them_stops(plain_nats):
    """The router joined first (the subscription is on its connection) and stops first. Main:
    the queue beside it heard no heartbeat again (its workers went stale: nothing dispatched)."""
    feeds = ProcessFeeds()
    pub = await natsutil.connect(plain_nats.url, "feed-move-pub")
    router = await ServiceHost(RouterShell(RouterConfig(), feeds=feeds), plain_nats.url).start()
    queue = await ServiceHost(QueueShell(QueueConfig(), FCFS(), feeds=feeds), plain_nats.url).start()
    try:
        await router.stop()
        assert feeds.heartbeats.nc is queue.nc
        await queue.nc.flush()  # the moved SUB is the server's before another connection beats
        await _beat(pub, "fw2")
        await until(lambda: "fw2" in queue.shell.core.workers, timeout_s=3, what="the queue hears fw2")
    finally:
        await queue.stop()
        await pub.drain()


async def test_a_listener_that_joins_again_is_called_once(plain_nats):
    feed: Feed[schemas.Heartbeat] = Feed(subjects.HEARTBEAT_ALL, schemas.Heartbeat)
    got: list[str] = []

    def listener(h, _now):
        got.append(h.worker_id)

    old = await natsutil.connect(plain_nats.url, "feed-old")
    new = await natsutil.connect(plain_nats.url, "feed-new")
    pub = await natsutil.connect(plain_nats.url, "feed-again-pub")
    try:
        await feed.join(old, listener)
        await old.close()  # gone without a leave
        await feed.join(new, listener)
        await new.flush()
        await _beat(pub, "fw3")
        await until(lambda: got, what="the beat")
        await _beat(pub, "fw4")
        await until(lambda: len(got) >= 2, what="the second beat")
        assert got == ["fw3", "fw4"]
        assert feed.nc is new
    finally:
        await new.drain()
        await pub.drain()


async def test_leaving_keeps_a_subscription_another_listener_shares_and_skips_a_connection_that_refuses(plain_nats):
    """Review of round 9: a listener leaving a connection another listener still uses moved the
    subscription off and back onto it (a gap); a remaining joiner whose connection is draining
    made `leave` raise, cutting the stopping service's own clean-up short."""
    got: list = []
    feed = Feed(subjects.heartbeat("*"), schemas.Heartbeat)
    shared = await natsutil.connect(plain_nats.url, "feed-shared")
    draining = await natsutil.connect(plain_nats.url, "feed-draining")
    a, b, c = (lambda hb, now: got.append(("a", hb))), (lambda hb, now: got.append(("b", hb))), \
        (lambda hb, now: got.append(("c", hb)))
    try:
        await feed.join(shared, a)
        await feed.join(shared, b)
        first = feed.subscription
        await feed.leave(a)
        assert feed.subscription is first and feed.nc is shared  # b still listens on it: untouched
        await feed.join(draining, c)
        await draining.drain()  # closing: a subscribe on it now fails
        await feed.leave(b)  # moves to c's connection, which refuses: no exception, no subscription
        assert feed.subscription is None and feed.listeners == [c]
    finally:
        await shared.drain()
