"""When admission calls the fleet down (a 503 with nothing queued): after 10 of the heartbeat
intervals a worker announces, or 3 × its own longest recent gap, of silence — counted on
admission's own waking time, so a stall of admission itself is not the workers' silence
(services/admission/liveness.py). Pure cases, a property over stalls, and two live ones: a
crashed fleet is refused within 2 s, and a 1.5 s stall of the whole in-process fleet between a
request's publish and its handling does not refuse it (the CI failure of round 5)."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.feasibility import FleetView
from tokenyard.services.admission.liveness import GAP_DECAY, LATE_FACTOR, MISSED_BEATS, Liveness
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, Rejected
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import hb
from tests.conftest import until
from tests.fault_fleet import crash_worker, start_fleet, stop_fleet

TICK = 0.1


def idle_queue() -> schemas.QueueStats:
    return schemas.QueueStats("q", 0.0, "hybrid", [0, 0, 0, 0], [0, 0, 0, 0], 0, 1000.0, 0.0, 0)


def ticking(f: FleetView, start: float, end: float, step: float = TICK / 2) -> None:
    """Admission's own ticks from `start` to `end` (it is awake, nothing else arrives)."""
    t = start
    while t <= end + 1e-9:
        f.awake(t)
        t += step


def beating(f: FleetView, wid: str, start: float, end: float, every: float, interval: float = 0.0) -> None:
    """Heartbeats every `every` s, admission ticking in between."""
    t = start
    while t <= end + 1e-9:
        f.on_heartbeat(hb(wid, interval_s=interval), t)
        ticking(f, t, min(t + every, end) - 1e-6)
        t += every


def view() -> FleetView:
    f = FleetView()
    f.live.tick_s = TICK
    return f


def test_a_silent_fleet_is_down_after_ten_announced_intervals():
    f = view()
    beating(f, "w0", 0.0, 2.0, 0.1, interval=0.1)
    beating(f, "w1", 0.0, 2.0, 0.1)  # announces nothing: the fleet default, 0.1 s
    ticking(f, 2.0, 2.99)
    assert not f.fleet_down(2.99)
    ticking(f, 2.99, 3.02)
    assert f.fleet_down(3.02)  # 1.02 s of silence > 10 × 0.1 s


def test_a_worker_announcing_a_longer_interval_gets_ten_of_them():
    f = view()
    beating(f, "w0", 0.0, 5.0, 0.5, interval=0.5)
    ticking(f, 5.0, 9.9)
    assert not f.fleet_down(9.9)
    ticking(f, 9.9, 10.1)
    assert f.fleet_down(10.1)


def test_a_late_worker_is_given_three_times_its_longest_recent_gap():
    f = view()
    beating(f, "w0", 0.0, 4.0, 0.4, interval=0.1)  # announces 0.1 s, beats every 0.4 s (a starved host)
    assert f.live.beats["w0"].gap_s > 0.399
    ticking(f, 4.0, 5.15)
    assert not f.fleet_down(5.15)  # 1.15 s: late by the announced interval, within 3 × 0.4 s
    ticking(f, 5.15, 5.25)
    assert f.fleet_down(5.25)
    # a stall's gap is forgotten as regular beats come back
    beating(f, "w0", 5.3, 12.0, 0.1, interval=0.1)
    assert f.live.bound_s("w0") == MISSED_BEATS * 0.1
    assert 0.4 * GAP_DECAY ** 67 * LATE_FACTOR < MISSED_BEATS * 0.1


def test_a_worker_back_from_an_absence_is_not_given_that_absence_as_lateness():
    """30 s gone (counted gone), 2 s back at 0.1 s, then dead: called down after its 1 s bound,
    not after 3 × the 30 s it was away."""
    f = view()
    beating(f, "w0", 0.0, 2.0, 0.1, interval=0.1)
    ticking(f, 2.0, 32.0)
    assert f.fleet_down(32.0)
    beating(f, "w0", 32.0, 34.0, 0.1, interval=0.1)
    assert f.live.bound_s("w0") == MISSED_BEATS * 0.1
    ticking(f, 34.0, 35.2)
    assert f.fleet_down(35.2)


def test_admissions_own_stall_is_not_the_workers_silence():
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    ticking(f, 10.0, 10.05)
    # the process runs nothing for 1.5 s; the first event after it is a request
    f.awake(11.55)
    assert not f.fleet_down(11.55)
    # awake again, and the worker stays silent: its silence counts on from 10.0, less the stall
    # beyond one tick (1.4 s): 0.95 s at 12.35, 1.1 s at 12.5
    ticking(f, 11.55, 12.35)
    assert not f.fleet_down(12.35)
    ticking(f, 12.35, 12.5)
    assert f.fleet_down(12.5)


def test_a_readiness_probe_after_a_stall_does_not_find_the_workers_gone():
    """/health asks admission what it sees (AdmissionShell.fleet_health): a stall of its process
    just before the probe is its own blind time, as for a request, not the workers' silence."""
    shell = AdmissionShell(AdmissionConfig(), ByteTokenizer())
    shell.core.ticks_every(0.05)
    now = time.time()
    for k in range(20):  # a worker beating every 0.1 s until 2 s ago, admission ticking beside it
        shell.core.on_tick(now - 4.0 + k * 0.1)
        shell.core.on_heartbeat(hb("w0", ts=now - 4.0 + k * 0.1), now - 4.0 + k * 0.1)
    # then nothing for 2 s (the process stalled): the first thing it does is answer a probe
    assert shell.fleet_health().workers_up == 1


def test_requests_handled_while_cut_off_from_the_bus_are_not_watching_time():
    """bench chaos (rate 12, seed 22): a 3 s nats-server outage, HTTP requests reaching admission
    in its own process every 0.2 s meanwhile. Each counted as watching, so half the outage was
    the workers' silence; the first NATS request after the bus came back was refused 503 "No
    worker is up" before the workers' next heartbeat. Cut off, every moment is blind."""
    f = view()
    beating(f, "w0", 0.0, 10.0, 0.1)
    t = 10.0
    while t < 13.0:  # the outage: requests from this process only, every 0.2 s
        f.awake(t, observing=False)
        assert f.up("w0", t), t  # nothing heard proves nothing, during the outage too
        t += 0.2
    back = 13.05
    ticking(f, back, back + 0.5)  # back on the bus; the worker not heard yet
    assert not f.fleet_down(back + 0.5)
    # and it stays silent: down once its own bound has passed — the core told of no return here;
    # told one (the shell's on_reconnected), it is excused the reconnect bound
    # (tests/test_admission_back_late.py)
    ticking(f, back + 0.5, back + 1.2)
    assert f.fleet_down(back + 1.2)


def test_without_a_tick_promise_nothing_counts_as_blind():
    f = FleetView()  # the simulator: every event on time, none promised
    beating(f, "w0", 0.0, 1.0, 0.1)
    f.awake(2.5)
    assert f.fleet_down(2.5) and f.live.blind_s == 0.0


def test_after_a_stall_a_fresh_queue_state_beside_old_heartbeats_is_no_dead_fleet():
    c = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    c.ticks_every(TICK)
    c.on_heartbeat(hb("w0"), 100.0)
    c.on_queue_stats(idle_queue(), 100.0)
    # admission runs nothing for 1.5 s; then a queue state (the queue's timer fired first) and
    # a request, before any heartbeat sent after the stall: the CI failure's shape (before
    # liveness.py: every worker 1.5 s silent beside a fresh queue state, 503 with nothing queued)
    c.on_queue_stats(idle_queue(), 101.45)
    c.on_tick(101.5)  # the shell notes the time before each request
    ok = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=101.5, new_id="r1")
    assert isinstance(ok, AdmittedRequest)
    for k in range(1, 13):  # awake from here, the queue reporting, the worker silent
        now = 101.5 + k * TICK
        c.on_tick(now)
        c.on_queue_stats(idle_queue(), now)
    c.on_tick(102.7)
    out = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=102.7, new_id="r2")
    assert isinstance(out, Rejected) and (out.status, out.code) == (503, "no_workers")
    assert out.message.startswith("No worker is up (none has been heard from lately, or every one is draining")


@settings(max_examples=150, deadline=None)
@given(stalls=st.lists(st.tuples(st.floats(0.5, 30.0), st.floats(0.0, 4.0)), max_size=6),
       every=st.sampled_from([0.05, 0.1, 0.3]))
def test_a_live_fleet_is_never_down_whatever_admission_stalls(stalls, every):
    """The worker beats every `every` s (≤ its bound) and admission ticks every 0.05 s, except
    during its stalls (start, length): nothing reaches it then, and what was sent meanwhile
    arrives at the stall's end, a request first. No event ever finds the fleet down."""
    events: list[tuple[float, int, str]] = []  # (time, order, kind)
    t = 0.0
    while t < 40.0:
        events.append((t, 1, "beat"))
        t += every
    t = 0.0
    while t < 40.0:
        events.append((t, 2, "tick"))
        t += 0.05
    for start, length in stalls:
        events.append((start + length, 0, "request"))
    delayed = []
    for when, order, kind in events:
        for start, length in stalls:
            if start < when < start + length:
                when = start + length  # held until admission runs again
        delayed.append((when, order, kind))
    f = view()
    for when, _, kind in sorted(delayed):
        if kind == "beat":
            f.on_heartbeat(hb("w0", interval_s=max(every, 0.1)), when)
        else:
            f.awake(when)
            assert not f.fleet_down(when), (when, kind)


@given(seen=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=30), gaps=st.lists(st.floats(0.0, 5.0), max_size=30))
def test_blind_time_never_exceeds_the_time_that_passed(seen, gaps):
    live = Liveness(tick_s=TICK)
    now = 0.0
    for g in gaps:
        now += g
        live.awake(now)
        assert 0.0 <= live.blind_s <= now
    for t in sorted(seen):
        live.awake(now + t)
        live.beat("w", 0.1, now + t)
        b = live.beats["w"]
        assert b.seen_s == now + t and b.blind_s == live.blind_s


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["beat", "sick", "keep", "awake", "ask"]),
                                 st.sampled_from(["w0", "w1", "w2"]), st.floats(0.0, 0.8)),
                       min_size=1, max_size=40))
def test_the_kept_up_set_is_every_worker_up_now(events):
    """FleetView.up_at keeps the workers up at a time until a heartbeat, a keep-alive or the
    observer's blind time changes; asked after any sequence of them it is `up` worker by worker."""
    f = FleetView(live=Liveness(tick_s=TICK))
    now = 0.0
    for kind, w, dt in events:
        now += dt
        if kind in ("beat", "sick"):
            f.on_heartbeat(hb(w, healthy=kind == "beat"), now)
        elif kind == "keep":
            f.on_keepalive(w, now)
        elif kind == "awake":
            f.awake(now)
        assert f.up_at(now) == {x for x in f.workers if f.up(x, now)}


# ───────────────────────────── live ─────────────────────────────


async def test_a_crashed_fleet_is_refused_within_two_seconds():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=2, router=False)
    nc = await natsutil.connect(server.url, "liveness-client")
    try:
        admission = hosts[2].shell
        await until(lambda: len(admission.core.fleet.workers) == 2)
        crashed = time.monotonic()
        for h in hosts[:2]:
            await crash_worker(h)
        # the first refusal a client gets, asking every 50 ms
        answer = None
        async with asyncio.timeout(5):
            while True:
                msg = await nc.request(subjects.SUBMIT, codec.encode(GenerateRequest(prompt="are you there")), timeout=2)
                answer = codec.decode(msg.data, schemas.StreamEvent)
                if isinstance(answer, Rejected):
                    break
                await asyncio.sleep(0.05)
        took = time.monotonic() - crashed
        assert (answer.status, answer.code) == (503, "no_workers") and "No worker is up" in answer.message, answer
        assert 0.9 <= took <= 2.0, took  # 10 × the 0.1 s heartbeat, and then at once
    finally:
        await nc.close()
        await stop_fleet(hosts)
        server.stop()


async def test_a_stall_of_the_whole_process_does_not_refuse_a_request(fleet):
    """The request is with the server; then the process (every service in it: admission, the
    workers' heartbeat loops) runs nothing for 1.5 s, and admission handles the request before
    any heartbeat sent after the stall reaches it. It is admitted and served. (This passes on
    the code before liveness.py too — there the queue's state had gone stale as well, and with
    no fresh queue state nothing is judged; the CI failure needed a fresh queue state beside
    stale heartbeats, the core test above.)"""
    nc = fleet.nats
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subjects.SUBMIT, codec.encode(GenerateRequest(prompt="after a stall", max_tokens=4)), reply=inbox)
    await nc.flush()
    time.sleep(1.5)  # the fault itself: the event loop blocked, as on a starved host
    first = codec.decode((await sub.next_msg(timeout=10)).data, schemas.StreamEvent)
    assert isinstance(first, schemas.Accepted), first
    async with asyncio.timeout(10):
        while not isinstance(codec.decode((await sub.next_msg(timeout=10)).data, schemas.StreamEvent), schemas.Finished):
            pass
    await sub.unsubscribe()


def test_a_fleet_that_never_had_a_worker_says_so_once_admission_has_listened_long_enough():
    """A fleet started without workers: the queue reports, no worker ever heartbeats. Admission
    admits while it may not have heard one yet (its first second), then refuses every class with
    a deadline naming the cause (503 no_workers), not a saturation nor a 429 deadline later."""
    c = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    c.on_queue_stats(idle_queue(), 100.0)
    first = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=100.5, new_id="r1")
    assert isinstance(first, AdmittedRequest)
    c.on_queue_stats(idle_queue(), 101.2)
    out = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=101.2, new_id="r2")
    assert isinstance(out, Rejected) and (out.status, out.code, out.retry_after_s) == (503, "no_workers", 1.0)
    assert out.message == ("No worker is up (none has been heard from): a P1 request cannot be served; "
                           "start a worker (tokenyard worker) or retry later")
    c.on_heartbeat(hb("w0"), 101.3)  # the first worker comes up: served again
    ok = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=101.3, new_id="r3")
    assert isinstance(ok, AdmittedRequest)


def test_admissions_own_stall_does_not_make_a_fleet_without_workers():
    """Review of round 9: admission stalled 1.25 s right after it started (its first tick, then
    nothing) has not been listening for a worker all that time: the stall is not their silence."""
    c = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    c.ticks_every(TICK)
    c.on_tick(100.0)
    c.on_queue_stats(idle_queue(), 101.25)
    ok = c.admit(GenerateRequest(prompt="a"), reply_to="inbox", json=False, headers={}, now=101.25, new_id="r1")
    assert isinstance(ok, AdmittedRequest)


async def test_requests_from_its_own_process_in_a_bus_outage_do_not_make_the_workers_look_silent():
    """Live: admission with a worker's heartbeats and a queue's state from another connection.
    The bus goes down for 3 s while requests reach admission from its own process (the edge in
    the queue's process) every 0.2 s; the bus comes back and a queue state arrives, the worker's
    next heartbeat not yet. Before, that request was refused 503 "No worker is up" (each request in
    the outage counted as watching: 1.5 s of the workers' silence)."""
    server = await natsutil.NatsServer().start()
    admission = AdmissionShell(AdmissionConfig(), ByteTokenizer())
    host = await ServiceHost(admission, server.url).start()
    peer = await natsutil.connect(server.url, "liveness-peer")

    async def beat() -> None:
        while True:
            await peer.publish(subjects.heartbeat("hw0"), codec.encode(hb("hw0")))
            await peer.publish(subjects.QUEUE_STATE, codec.encode(idle_queue()))
            await asyncio.sleep(0.1)

    async def ask() -> list[schemas.StreamEvent]:
        """This request's answers (a refusal at once, within the call; `accepted` once stored)."""
        answers: list[schemas.StreamEvent] = []

        async def respond(data: bytes, headers=None) -> None:
            answers.append(codec.decode(data, schemas.StreamEvent))

        await admission.submit(GenerateRequest(prompt="are you there", max_tokens=4), "_INBOX.nobody", {}, respond)
        return answers

    beats = asyncio.create_task(beat())
    try:
        await until(lambda: admission.core.fleet.up("hw0", time.time()) and admission.core.fleet.queues)
        beats.cancel()
        server.stop()
        await until(lambda: not admission.nc.is_connected, what="admission saw the bus go")
        for _ in range(15):  # 3 s of requests from its own process, cut off from the bus
            await ask()
            await asyncio.sleep(0.2)
        queues_before = dict(admission.core.fleet.queues)
        await server.start()
        await until(lambda: admission.nc.is_connected and peer.is_connected, what="both back")
        await peer.publish(subjects.QUEUE_STATE, codec.encode(idle_queue()))  # the queue is back; the worker not yet
        await until(lambda: admission.core.fleet.queues != queues_before, what="a fresh queue state")
        await natsutil.ensure_queue_stream(peer)
        answers = await ask()
        await until(lambda: answers, what="admission's answer")
        assert isinstance(answers[0], schemas.Accepted), answers[0]  # not a 503 "No worker is up"
    finally:
        beats.cancel()
        await peer.close()
        await host.stop()
        server.stop()
