"""The queue's flow control (on by default): room measured in prefill time from heartbeats and
what was routed since, bounded by KV memory and the running decodes' TPOT slack; decode-phase
workers offer none, an EcoServe prefill phase keeps a backlog it can work through."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.shared.schemas import AdmittedRequest, Heartbeat

from tests.builders import hb, req
from tests.test_queue_core import classed, ids


def fhb(wid: str, queued: int = 0, kv_free_blocks: int = 10_000, ms_per_token: float = 0.1, waiting: int = 0,
        tpot_slack_ms: float | None = None):
    """A heartbeat as flow control reads it: 0.1 ms per prompt token → H = 0.25 s is 2500 tokens."""
    return hb(wid, waiting=waiting, queued=queued, free=kv_free_blocks, prefill_ms_per_token=ms_per_token,
              tpot_slack_ms=tpot_slack_ms)


def sized(rid: str, prompt_len: int, arrival: float = 0.0, cls: int = 1) -> AdmittedRequest:
    return req(rid, prompt_len, 4, cls, arrival_s=arrival)


def test_flow_control_is_on_by_default_and_measures_room_in_prefill_time():
    q = QueueCore(QueueConfig(), FCFS())
    assert q.cfg.flow_control and q.cfg.expire_deadlines
    q.on_heartbeat(fhb("w0", queued=1000), 0.0)  # 2500 − 1000 = 1500 tokens of room
    q.on_heartbeat(fhb("w1", queued=3000), 0.0)  # over its backlog: 0, not −500
    assert q.headroom(0.0) == 1500
    for i, n in enumerate((1000, 400, 300, 50)):
        q.offer(sized(f"r{i}", n, float(i)), 0.0)
    # 1000 + 400 = 1400 < 1500: one more goes (the last may overshoot), then the room is spent
    assert ids(q.dispatchable(0.0)) == ["r0", "r1", "r2"]
    assert q.headroom(0.0) == 1500 - 1700 and q.saturated(0.0)


def test_what_was_routed_since_a_heartbeat_fills_its_worker_until_the_next():
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0"), 0.0)
    q.offer(sized("a", 2000), 0.0)
    q.offer(sized("b", 2000), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a", "b"]  # 2500 room: a leaves 500, b overshoots
    q.on_routed("a", "w0", 0.0)
    q.on_routed("b", "w0", 0.0)
    q.offer(sized("c", 10), 0.0)
    assert q.dispatchable(0.05) == []  # backlog 4000 > 2500
    q.on_heartbeat(fhb("w0", queued=2000), 0.1)  # the engine prefilled 2000 of them
    assert ids(q.dispatchable(0.1)) == ["c"]


def test_kv_memory_bounds_the_room_too():
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0", queued=100, kv_free_blocks=20), 0.0)  # 320 tokens of KV free
    assert q.headroom(0.0) == 220


def test_a_worker_that_reports_no_prefill_rate_takes_requests_while_under_two_wait():
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0", ms_per_token=0.0, waiting=1), 0.0)
    q.on_heartbeat(fhb("w1", ms_per_token=0.0, waiting=2), 0.0)
    assert q.headroom(0.0) == 1


def test_flow_control_off_fills_workers_by_slots():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=3), FCFS())
    q.on_heartbeat(fhb("w0", queued=10**6), 0.0)
    assert q.headroom(0.0) == 3


def test_p0_goes_from_its_reserve_while_the_fleet_is_saturated():
    from tokenyard.services.priority_queue.policies.registry import make_policy

    q = QueueCore(QueueConfig(p0_reserve_per_worker=1), make_policy("hybrid"))
    q.on_heartbeat(fhb("w0", queued=5000), 0.0)
    q.offer(sized("p1", 10), 0.0)
    q.offer(sized("z0", 10, cls=0), 0.0)
    q.offer(sized("z1", 10, cls=0), 0.0)
    assert ids(q.dispatchable(0.0)) == ["z0"]
    q.on_routed("z0", "w0", 0.0)
    assert q.dispatchable(0.05) == []  # its reserve is spent until the next heartbeat
    q.on_heartbeat(fhb("w0", queued=5000), 0.1)
    assert ids(q.dispatchable(0.1)) == ["z1"]


@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 3), st.floats(0, 3)), max_size=40),
       st.lists(st.integers(0, 6000), min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_released_prompt_tokens_never_exceed_the_room_by_more_than_one_request(reqs, backlogs):
    q = QueueCore(QueueConfig(p0_reserve_per_worker=0), FCFS())
    for i, b in enumerate(backlogs):
        q.on_heartbeat(fhb(f"w{i}", queued=b), 0.0)
    room = q.headroom(0.0)
    for i, (n, c, t) in enumerate(reqs):
        q.offer(sized(f"r{i}", n, t, cls=c), 0.0)
    out = q.dispatchable(0.0)
    sent = sum(r.prompt_len for r in out)
    assert sent == 0 if room <= 0 else sent - max((r.prompt_len for r in out), default=0) < room
    assert len(out) + len(q) == len(reqs)


def test_the_drain_counts_only_what_left_a_backlog_per_second_of_backlog():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=1, drain_window_s=2.0), FCFS())
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(classed("a", 1, 0.0, prompt_len=96), 0.0)  # cost 100; the queue empties: no backlog
    assert ids(q.dispatchable(0.0)) == ["a"]
    q.on_routed("a", "w0", now=0.1)
    assert q.drain_rate(0.2) == (0.0, 0.0)  # no backlog yet: a's leaving measured the demand only
    assert not q.stats("pq", 0.2).drain_measured  # and admission is told so: 0 is no rate, not a stall
    q.on_heartbeat(hb("w0"), 1.0)
    for rid in ("b", "c"):
        q.offer(classed(rid, 1, 1.0, prompt_len=46), 1.0)  # cost 50 each
    assert ids(q.dispatchable(1.0)) == ["b"]  # c waits: a backlog from 1.0
    assert not q.stats("pq", 1.2).drain_measured  # 0.2 s of backlog: too young to measure
    q.on_routed("b", "w0", now=1.2)
    # 0.5 s of backlog held, 50 tokens left it (a's 100 routed with nothing waiting do not count)
    assert q.drain_rate(1.5) == (100.0, 2.0)
    assert q.stats("pq", 1.5).drain_measured


def test_the_running_decodes_tpot_slack_bounds_the_room():
    """A prefill chunk delays every decode's next token: a worker holds no more prefill than its
    tightest decode's TPOT slack absorbs (shared.slo.prefill_budget_s), and none once a decode has
    none left; with nothing decoding only H bounds it."""
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0", queued=300, tpot_slack_ms=100.0), 0.0)  # 0.1 s = 1000 tokens
    assert q.headroom(0.0) == 700
    q.on_heartbeat(fhb("w0", queued=300, tpot_slack_ms=900.0), 0.0)  # more slack than H: H bounds it
    assert q.headroom(0.0) == 2200
    q.on_heartbeat(fhb("w0", tpot_slack_ms=-20.0), 0.0)
    assert q.headroom(0.0) == 0 and q.saturated(0.0)
    q.on_heartbeat(fhb("w0"), 0.0)
    assert q.headroom(0.0) == 2500


def test_a_worker_in_its_decode_phase_offers_no_room():
    """EcoServe's decode phase and a P/D decode worker refuse every new request (the worker's
    offer says "decode phase"): room counted there would go to the router and bounce back."""
    from tokenyard.services.priority_queue.policies.registry import make_policy

    q = QueueCore(QueueConfig(p0_reserve_per_worker=1), make_policy("hybrid"))
    q.on_heartbeat(hb("p", queued=1000, prefill_ms_per_token=0.1, phase="prefill"), 0.0)  # 1500 of room
    q.on_heartbeat(hb("d", prefill_ms_per_token=0.1, phase="decode"), 0.0)  # idle, but takes none
    q.on_heartbeat(hb("m", queued=2400, prefill_ms_per_token=0.1, phase="mixed"), 0.0)  # 100
    assert q.headroom(0.0) == 1600
    for rid, cls in (("a", 1), ("z0", 0), ("z1", 0), ("z2", 0)):
        q.offer(sized(rid, 2000, cls=cls), 0.0)
    # z0 takes the room; the P0 reserve is one per worker that takes new requests: p and m
    assert ids(q.dispatchable(0.0)) == ["z0", "z1", "z2"]
    for rid, wid in (("z0", "p"), ("z1", "p"), ("z2", "m")):
        q.on_routed(rid, wid, 0.0)
    # the phases rotate: p decodes what it prefilled, d takes its turn at prefill
    q.on_heartbeat(hb("p", running=2, prefill_ms_per_token=0.1, phase="decode"), 0.1)
    q.on_heartbeat(hb("d", prefill_ms_per_token=0.1, phase="prefill"), 0.1)
    assert q.headroom(0.1) == 2500  # d's whole H; m, sent z2 since its heartbeat, has none

    off = QueueCore(QueueConfig(flow_control=False, slots_per_worker=3), FCFS())
    off.on_heartbeat(hb("d", phase="decode"), 0.0)
    off.on_heartbeat(hb("p", waiting=1, phase="prefill"), 0.0)
    assert off.headroom(0.0) == 2


def test_an_ecoserve_prefill_phase_keeps_a_backlog_its_phase_can_work_through():
    """Flow control's quarter second of prefill is under one chunk on a slow engine: an EcoServe
    prefill-phase worker would then never hold more than the 2 waiting requests at which its
    phase ends, so it has room for one more request while waiting + sent ≤ 2 and its backlog
    is under its minimum phase length (1 s) of prefill."""
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(hb("eco", queued=5000, waiting=1, prefill_ms_per_token=0.1, phase="prefill", mode="ecoserve"), 0.0)
    q.on_heartbeat(hb("pd", queued=5000, prefill_ms_per_token=0.1, phase="prefill", mode="pd"), 0.0)
    assert q.headroom(0.0) == 1
    for rid in "abcd":
        q.offer(sized(rid, 2000), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a"]
    q.on_routed("a", "eco", 0.0)
    assert ids(q.dispatchable(0.0)) == ["b"]  # waiting 1 + sent 1 = 2, 0.7 s: still starved
    q.on_routed("b", "eco", 0.0)
    assert q.dispatchable(0.0) == [] and q.headroom(0.0) == 0  # 3 waiting: its phase goes on
    q.on_heartbeat(hb("eco", queued=9000, waiting=1, prefill_ms_per_token=0.1, phase="prefill", mode="ecoserve"), 0.1)
    assert ids(q.dispatchable(0.1)) == ["c"]  # 0.9 s
    q.on_routed("c", "eco", 0.1)
    assert q.dispatchable(0.1) == []  # 1.1 s: a minimum phase's work is there


def test_workers_whose_prefill_takes_no_time_take_everything_their_kv_holds():
    """The control-plane benchmark's zero-latency workers reported a prefill cost of 0, which
    flow control read as "not measured yet" and met with 2 waiting requests a worker per
    heartbeat: a fleet of 2 took 37 req/s of 250 and admission refused the rest (487 × 503).
    Their heartbeat, from the real engine's stats, now lets the queue release the whole
    backlog in one dispatch."""
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.latency import profile

    engine_stats = SimEngineCore(profile("zero"), num_blocks=4096, block_size=16).stats()
    assert engine_stats.prefill_ms_per_token > 0
    q = QueueCore(QueueConfig(), FCFS())
    for w in ("w0", "w1"):
        q.on_heartbeat(Heartbeat(worker_id=w, model="m", seq=1, ts=0.0, stats=engine_stats), 0.0)
    for i in range(100):
        q.offer(req(f"r{i}", prompt_len=32), 0.0)
    assert len(q.dispatchable(0.01)) == 100
