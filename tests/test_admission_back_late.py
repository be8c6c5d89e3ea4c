"""A worker back from an outage later than admission (services/admission/liveness.py, the
excuse). After admission's own connection comes back, each worker reconnects on its own backoff,
up to natsutil.RECONNECT_BOUND_S through a healed partition (a connect attempt in flight to the
silent address waited out: ~5.3 s). Before, admission counted the worker's silence from its own
return and called it down after its 1 s bound: every request in that window was refused 503 "No
worker is up", /health said no_workers, though an admitted request waits in the queue, stored,
for the worker and loses nothing. A worker up when admission lost the bus is now excused the
reconnect bound from admission's return; one silent while admission heard the bus is not.

Pure cases on the core, a property over outages, then live: `tokenyard up`'s front (router,
queue, admission, the HTTP edge in one process) and a worker cut off together
(tests/silent_proxy.py); the path heals, the front is back at once, the worker ~5.3 s later. Then
the worker, back and beating, dies while the front stays connected: refused after its own bound,
as before."""

from __future__ import annotations

import asyncio
import collections
import json
import time

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.feasibility import FleetView
from tokenyard.services.admission.liveness import MISSED_BEATS
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.shared import config, natsutil, readiness, subjects
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, PriorityClass
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.slo import ENGINE_BACKLOG_S, TTFT_TARGET_S
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import hb
from tests.conftest import stop_hosts, until
from tests.fault_fleet import crash_worker, worker
from tests.silent_proxy import SilentProxy
from tests.test_admission_liveness import TICK, beating, idle_queue, ticking, view
from tests.test_edge_in_queue import health, start_front

E = natsutil.RECONNECT_BOUND_S
BOUND = MISSED_BEATS * 0.1
"""A worker's own bound at the fleet's 0.1 s heartbeat."""


def outage(f: FleetView, start: float, end: float) -> None:
    """Admission cut off from the bus from `start` to `end`, ticking (it knows it)."""
    t = start
    while t < end:
        f.awake(t, observing=False)
        t += TICK / 2


def core_with(workers: tuple[str, ...], until_s: float) -> AdmissionCore:
    """An AdmissionCore that heard `workers` beat and a queue report every 0.1 s up to `until_s`."""
    c = AdmissionCore(AdmissionConfig(default_ceiling=PriorityClass.P0), ByteTokenizer())
    c.ticks_every(TICK)
    t = 0.0
    while t <= until_s + 1e-9:
        c.on_tick(t)
        for w in workers:
            c.on_heartbeat(hb(w), t)
        c.on_queue_stats(idle_queue(), t)
        t += 0.1
    return c


def ask(c: AdmissionCore, tier: str, now: float):
    """A request of class `tier` at `now`, admission awake (ticking) since its previous event."""
    ticking(c.fleet, c.fleet.live.last_event_s, now)
    c.on_tick(now)
    c.on_queue_stats(idle_queue(), now)  # the queue, back on the bus too, reports
    return c.admit(GenerateRequest(prompt="are you there", max_tokens=4), reply_to="inbox", json=False,
                   headers={"x-request-tier": tier}, now=now, new_id=f"{tier}-{now}")


def test_a_worker_up_when_admission_lost_the_bus_is_excused_the_reconnect_bound():
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    outage(f, 10.0, 13.0)
    ticking(f, 13.0, 13.0)
    f.on_reconnected(13.0, E)
    ticking(f, 13.0, 13.0 + E + BOUND - 0.05)
    assert f.up("w0", 13.0 + E + BOUND - 0.05)  # before: down at 13.0 + BOUND
    assert f.live.overdue_s("w0", 13.5) is None  # within its own bound: not overdue yet
    assert f.live.overdue_s("w0", 14.5) == pytest.approx(E - 1.5)  # the excuse left
    ticking(f, 13.0 + E + BOUND - 0.05, 13.0 + E + BOUND + 0.1)
    assert f.fleet_down(13.0 + E + BOUND + 0.1)  # it died in the outage: found, E later


def test_a_worker_back_within_the_bound_is_heard_as_before_and_its_reconnect_is_no_lateness():
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    outage(f, 10.0, 13.0)
    f.on_reconnected(13.0, E)
    ticking(f, 13.0, 18.3)
    beating(f, "w0", 18.3, 20.0, 0.1)  # back 5.3 s after admission
    b = f.live.beats["w0"]
    assert (b.excuse_s, b.gap_s, b.bound_s) == (0.0, pytest.approx(0.1), BOUND)
    ticking(f, 20.0, 21.05)
    assert f.fleet_down(21.05)  # then dead while admission hears the bus: its own bound, as ever


def test_a_worker_silent_while_admission_heard_the_bus_is_not_excused():
    f = view()
    beating(f, "w1", 0.0, 5.0, 0.1)  # w1 dies at 5.0 while admission hears w0 on
    beating(f, "w0", 5.0, 10.0, 0.1)
    outage(f, 10.0, 13.0)
    f.on_reconnected(13.0, E)
    ticking(f, 13.0, 13.05)
    assert f.up("w0", 13.05) and not f.up("w1", 13.05)
    assert f.live.beats["w1"].excuse_s == 0.0


def test_a_silent_partition_is_dated_from_the_last_thing_heard():
    """Cut without a FIN: admission's connection looks up, its ticks watch, and it hears nothing
    from 10.0; w0 is called down at 11.0 (it cannot know better). The heal resets the connection,
    back at 12.0: w0 was up when admission last heard the bus, and is excused from 12.0."""
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    f.on_queue_stats(idle_queue(), 10.0)
    ticking(f, 10.0, 11.1)
    assert f.fleet_down(11.1)
    ticking(f, 11.1, 12.0)
    f.on_reconnected(12.0, E)
    assert f.up("w0", 12.0)
    ticking(f, 12.0, 12.0 + E + BOUND - 0.05)
    assert f.up("w0", 12.0 + E + BOUND - 0.05)


def test_admission_admits_while_the_worker_reconnects_and_counts_the_excuse_left_as_wait():
    c = core_with(("w0",), 10.0)
    outage(c.fleet, 10.0, 13.0)
    c.on_reconnected(13.0, E)
    early = ask(c, "P0", 13.5)  # within its own bound: no different from before the outage
    assert isinstance(early, AdmittedRequest), early
    health = c.fleet_health(13.5)
    assert (health.workers_up, health.workers_reconnecting) == (1, 0)
    p2 = ask(c, "P2", 14.5)  # before: 503 no_workers
    assert isinstance(p2, AdmittedRequest), p2
    p0 = ask(c, "P0", 14.5)  # it may take E − 1.5 s more: beyond P0's 0.5 s
    assert (p0.status, p0.code, p0.reason) == (503, "overloaded", "workers_reconnecting"), p0
    assert p0.retry_after_s == pytest.approx(E - 1.5 + ENGINE_BACKLOG_S - TTFT_TARGET_S[0])
    assert p0.message == (f"No worker has been heard from since admission's return to the bus: the 1 up may take "
                          f"{E - 1.5:.1f} s more to reconnect, beyond a P0 request's 0.5 s TTFT target; retry later")
    health = c.fleet_health(14.5)
    assert (health.workers_up, health.workers_reconnecting) == (1, 1)
    assert readiness.judge(True, health) == readiness.Readiness(
        200, {"status": "ok", "workers_up": 1, "workers_known": 1, "workers_reconnecting": 1})
    ticking(c.fleet, 14.5, 18.3)
    c.on_heartbeat(hb("w0"), 18.3)  # back
    assert isinstance(ask(c, "P0", 18.35), AdmittedRequest)
    assert c.fleet_health(18.35).workers_reconnecting == 0
    c2 = core_with(("w0",), 10.0)  # never back: 503 no_workers, E after the return
    outage(c2.fleet, 10.0, 13.0)
    c2.on_reconnected(13.0, E)
    late = ask(c2, "P2", 13.0 + E + BOUND + 0.1)
    assert (late.status, late.code) == (503, "no_workers"), late
    assert readiness.judge(True, c2.fleet_health(13.0 + E + BOUND + 0.1)).body["reason"] == "no_workers"


def test_one_worker_heard_since_the_return_serves_now_whatever_the_others():
    c = core_with(("w0", "w1"), 10.0)
    outage(c.fleet, 10.0, 13.0)
    c.on_reconnected(13.0, E)
    c.on_heartbeat(hb("w1"), 13.1)
    ticking(c.fleet, 13.1, 14.5)
    c.on_heartbeat(hb("w1"), 14.5)
    assert c.fleet.live.reconnecting(c.fleet.up_at(14.5), 14.5) == (1, 0.0)
    assert isinstance(ask(c, "P0", 14.5), AdmittedRequest)


@settings(max_examples=150, deadline=None)
@given(silent_cut=st.floats(0.0, 8.0), cut_off=st.floats(0.0, 30.0), returns=st.floats(0.0, E - 0.15))
def test_a_worker_back_within_the_bound_is_never_down_and_one_never_back_is_down_after_it(silent_cut, cut_off,
                                                                                         returns):
    """Admission hears nothing for `silent_cut` s while it believes itself connected (a partition
    its connection has not noticed; a ping finds one within ~8 s), then is cut off, knowing it,
    for `cut_off` s, and is back; w0 is back `returns` s after it (≤ the bound, less a beat),
    w1 never. w0 is up at every tick after the return; w1 is up until back + E + its bound and
    down after."""
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    beating(f, "w1", 0.0, 10.0, 0.1)
    lost = 10.0 + silent_cut
    ticking(f, 10.0, lost)
    outage(f, lost, lost + cut_off)
    back = lost + cut_off
    f.on_reconnected(back, E)
    t = back
    while t < back + E + 3.0:
        if t >= back + returns:
            f.on_heartbeat(hb("w0"), t)  # (on_heartbeat notes the time itself)
        else:
            f.awake(t)
        assert f.up("w0", t), t
        assert f.up("w1", t) == (t <= back + E + BOUND), (t, back)
        t += TICK / 2


class Conn:
    """A connection as `AdmissionShell._note_return` reads one: its reconnect count, its state."""

    def __init__(self) -> None:
        self.stats = {"reconnects": 0}
        self.is_connected = True


def test_only_the_heartbeats_connection_coming_back_excuses_the_workers():
    """The shell's seam: admission's own connection back alone (the heartbeats heard meanwhile on
    another service's, in its process) excuses no one; the heartbeats' connection back does."""
    shell = AdmissionShell(AdmissionConfig(), ByteTokenizer())
    shell.core.ticks_every(TICK)
    shell.nc, shell.feeds.heartbeats.nc = Conn(), Conn()
    for k in range(100):
        shell._on_heartbeat(hb("w0"), k * 0.1)  # (the first look counts no reconnect)
    shell.nc.stats["reconnects"] = 1
    shell._awake(9.95)
    assert shell.core.fleet.live.beats["w0"].excuse_s == 0.0
    shell.feeds.heartbeats.nc.stats["reconnects"] = 1
    shell._awake(10.0)
    assert shell.core.fleet.live.beats["w0"].excuse_s == E
    shell._awake(10.05)  # counted once
    assert shell.core.fleet.live.beats["w0"].seen_s == 10.0


async def complete(url: str, tier: str, max_tokens: int = 4) -> tuple[int, dict, dict]:
    """A completion over HTTP: (status, body, headers)."""
    body = {"model": config.DEFAULT_MODEL, "prompt": "while the worker reconnects", "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as s, \
            s.post(f"{url}/v1/completions", json=body, headers={"x-request-tier": tier}) as r:
        return r.status, json.loads(await r.text()), dict(r.headers)


# ───────────────────────────── live ─────────────────────────────


async def test_admission_admits_while_a_worker_is_still_reconnecting_and_refuses_one_that_died(plain_nats):
    nc = await natsutil.connect(plain_nats.url, "back-late-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    to_worker, to_front = await SilentProxy(plain_nats.port).start(), await SilentProxy(plain_nats.port).start()
    hosts = [await ServiceHost(worker("bw0"), to_worker.url).start()]
    late = hosts[0]
    try:
        front = await start_front(to_front.url, AdmissionConfig(default_ceiling=PriorityClass.P0))
        hosts += front.hosts
        admission = front.admission
        await until(lambda: admission.core.fleet.up("bw0", time.time()), what="admission hears bw0")
        assert (await health(front))[0] == 200
        await to_worker.cut(reset=True)  # its attempts hang on the silent address
        await to_front.cut()  # the front's connections go silent
        await until(lambda: late.nc.is_connecting, what="bw0's reconnect attempt in flight to the silent address")
        await to_front.heal()  # resets the front's connections: back at once
        await to_worker.heal()
        loop = asyncio.get_running_loop()
        healed = loop.time()
        await until(lambda: all(h.nc.is_connected and h.nc.stats["reconnects"] == 1 for h in front.hosts),
                    what="the front back")

        async def back() -> float:
            await until(lambda: late.nc.is_connected, timeout_s=natsutil.RECONNECT_BOUND_S, poll_s=0.02, what="bw0 back")
            return loop.time() - healed

        returned = asyncio.ensure_future(back())

        async def probe() -> list[tuple[int, dict, dict]]:
            """A P2 every 0.1 s (a client's pace, not an ordering) from the front's return until
            0.5 s after bw0's: each answer."""
            sent = []
            while not returned.done() or loop.time() - healed < returned.result() + 0.5:
                sent.append(asyncio.ensure_future(complete(front.url, "P2")))
                await asyncio.sleep(0.1)
            return await asyncio.gather(*sent)

        probing = asyncio.ensure_future(probe())
        # past bw0's own bound (10 × 0.1 s) of silence since the front's return: before, down here
        await until(lambda: admission.core.fleet.live.overdue_s("bw0", time.time()) is not None,
                    what="bw0 silent past its own bound since the front's return")
        assert not late.nc.is_connected, "bw0 back already: the window this test is about is gone"
        at = loop.time() - healed
        # P0 (0.5 s): bw0 may take the rest of natsutil.RECONNECT_BOUND_S, counted as wait:
        # overloaded, not no_workers, and told when that wait would fit
        p0 = await complete(front.url, "P0")
        p0_at = loop.time() - healed
        ready = await health(front)
        # P2 (60 s): admitted, stored; served once bw0 is back
        async with asyncio.timeout(30):
            p2 = await complete(front.url, "P2")
        served_at = loop.time() - healed
        back_after = await returned
        async with asyncio.timeout(30):
            probed = await probing
        print(f"\nheal +{at:.2f} s: P0 {p0[0]} {p0[1].get('error', {}).get('code')} Retry-After "
              f"{p0[2].get('Retry-After')}; /health {ready}; P2 {p2[0]} {p2[1].get('error', {}).get('code')} "
              f"answered at +{served_at:.2f} s; bw0 back at +{back_after:.2f} s; a P2 every 0.1 s: "
              f"{collections.Counter(a[0] for a in probed)}")
        assert (p0[0], p0[1]["error"]["code"]) == (503, "overloaded"), p0
        expected = natsutil.RECONNECT_BOUND_S - p0_at + ENGINE_BACKLOG_S - TTFT_TARGET_S[0]
        assert abs(float(p0[2]["Retry-After"]) - expected) <= 1.0, (p0[2], expected)  # whole seconds, rounded up
        assert ready == (200, {"status": "ok", "workers_up": 1, "workers_known": 1, "workers_reconnecting": 1})
        assert p2[0] == 200, p2
        assert (p2[1]["usage"]["completion_tokens"], p2[1]["choices"][0]["finish_reason"]) == (4, "length"), p2
        assert late.nc.is_connected and late.nc.stats["reconnects"] == 1
        assert natsutil.IDLE_RECONNECT_BOUND_S < back_after <= natsutil.RECONNECT_BOUND_S, back_after
        assert served_at > back_after  # served once bw0 was back, not by anyone else
        assert len(probed) >= 40 and all(a[0] == 200 and a[1]["usage"]["completion_tokens"] == 4 for a in probed), \
            [a[:2] for a in probed if a[0] != 200][:3]  # before: 503 no_workers from +1.3 s to bw0's return

        # bw0 dies while the front stays connected: not ready, and refused, once its own bound has
        # passed, as ever (not a reconnect's excuse later)
        crashed = loop.time()
        await crash_worker(late)
        status, body = await until(lambda: _health_is(front, 503), timeout_s=5, poll_s=0.02, what="bw0 down")
        took = loop.time() - crashed
        assert (body["reason"], body["workers_up"]) == ("no_workers", 0), body
        assert BOUND - 0.2 <= took <= 2.0, took  # its bound from its last heartbeat (≤ 0.1 s before), not E later
        status, body, _ = await complete(front.url, "P2")
        assert (status, body["error"]["code"]) == (503, "no_workers") and "No worker is up" in body["error"]["message"]
        print(f"crash: no_workers after {took:.2f} s")
    finally:
        await stop_hosts(hosts)
        await to_worker.stop()
        await to_front.stop()


async def _health_is(front, want: int) -> tuple[int, dict] | None:
    answer = await health(front)
    return answer if answer[0] == want else None
