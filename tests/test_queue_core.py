"""QueueCore: offer / abort, headroom from heartbeats, late dispatch, routed / not routed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.shared.schemas import AdmittedRequest

from tests.builders import hb, req

WORK = req("x").prompt_len + req("x").max_tokens
"""A request's work in the queue's ledger (prompt + output tokens)."""


def make(slots: int = 2, stale: float = 1.0, backoff: float = 0.5) -> QueueCore:
    return QueueCore(
        QueueConfig(flow_control=False, slots_per_worker=slots, stale_after_s=stale, retry_backoff_s=backoff), FCFS()
    )


def ids(reqs: list[AdmittedRequest]) -> list[str]:
    return [r.request_id for r in reqs]


def test_offer_queues_once():
    q = make()
    assert q.offer(req("a"), 0.0) is True
    assert q.offer(req("a"), 0.1) is False  # a redelivery of a waiting request
    assert len(q) == 1


def test_offer_of_a_request_in_flight_is_refused():
    q = make()
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(req("a"), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a"]
    assert q.offer(req("a"), 0.1) is False
    assert len(q) == 0 and list(q.in_flight) == ["a"]


def test_no_workers_no_headroom_nothing_dispatched():
    q = make()
    q.offer(req("a"), 0.0)
    assert q.headroom(0.0) == 0
    assert q.dispatchable(0.0) == []
    assert len(q) == 1


def test_headroom_is_free_slots_of_fresh_healthy_workers_minus_in_flight():
    q = make(slots=4)
    q.on_heartbeat(hb("w0", waiting=1), 0.0)  # 3 free
    q.on_heartbeat(hb("w1", waiting=6), 0.0)  # over its slots: 0, not −2
    q.on_heartbeat(hb("w2", healthy=False), 0.0)
    q.on_heartbeat(hb("w3", draining=True), 0.0)
    q.on_heartbeat(hb("w4", waiting=2), 0.0)  # 2 free
    assert q.headroom(0.5) == 5
    q.offer(req("a"), 0.5)
    q.offer(req("b"), 0.5)
    assert ids(q.dispatchable(0.5)) == ["a", "b"]
    assert q.headroom(0.5) == 3  # two in flight


def test_stale_workers_give_no_headroom():
    q = make(slots=4, stale=1.0)
    q.on_heartbeat(hb("w0"), 0.0)
    q.on_heartbeat(hb("w1"), 0.5)
    assert q.headroom(1.0) == 8  # exactly stale_after_s old is still fresh
    assert q.headroom(1.2) == 4
    assert q.headroom(1.6) == 0


def test_dispatch_pops_in_policy_order_up_to_headroom():
    q = make(slots=3)
    q.on_heartbeat(hb("w0", waiting=1), 0.0)  # 2 free
    for rid, t in [("c", 3.0), ("a", 1.0), ("b", 2.0)]:
        q.offer(req(rid, arrival_s=t), t)
    assert ids(q.dispatchable(0.1)) == ["a", "b"]
    assert q.dispatchable(0.1) == []  # both in flight use the room
    assert len(q) == 1 and set(q.in_flight) == {"a", "b"}


def test_routed_requests_count_against_their_worker_until_its_next_heartbeat():
    q = make(slots=2)
    q.on_heartbeat(hb("w0"), 0.0)
    for rid in "abc":
        q.offer(req(rid, arrival_s=ord(rid)), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a", "b"]
    assert q.on_routed("a", "w0").request_id == "a"
    assert q.on_routed("b", "w0").request_id == "b"
    assert q.in_flight == {}
    assert q.workers["w0"].sent == 2
    assert q.dispatchable(0.1) == []  # w0's two slots hold what was sent
    q.on_heartbeat(hb("w0", waiting=1), 0.2)  # the worker now reports one waiting, sent resets
    assert q.workers["w0"].sent == 0
    assert ids(q.dispatchable(0.2)) == ["c"]


def test_on_routed_of_an_unknown_request_or_worker():
    q = make()
    assert q.on_routed("nope", "w9") is None
    assert q.workers == {}


def test_not_routed_puts_the_request_back_at_its_turn_and_pauses():
    q = make(slots=2, stale=10.0, backoff=0.5)
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(req("a", arrival_s=1.0), 1.0)
    q.offer(req("b", arrival_s=2.0), 2.0)
    assert ids(q.dispatchable(2.0)) == ["a", "b"]
    q.offer(req("c", arrival_s=3.0), 3.0)
    q.on_not_routed("a", now=3.0)
    assert "a" not in q.in_flight and len(q) == 2
    assert q.paused_until == 3.5
    assert q.dispatchable(3.4) == []
    q.on_heartbeat(hb("w0"), 3.5)
    assert ids(q.dispatchable(3.5)) == ["a"]  # 2 slots − b in flight = 1, and a is first again


def test_not_routed_because_aborted_drops_the_request():
    q = make()
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(req("a"), 0.0)
    q.dispatchable(0.0)
    q.on_not_routed("a", 0.1, aborted=True)
    assert len(q) == 0 and q.in_flight == {} and q.paused_until == 0.0


def test_not_routed_for_an_unknown_request_changes_nothing():
    q = make()
    q.on_not_routed("ghost", 1.0)
    assert q.paused_until == 0.0 and len(q) == 0


def test_abort_takes_a_waiting_request_out():
    q = make()
    a = req("a")
    q.offer(a, 0.0)
    assert q.abort("a") is a
    assert q.abort("a") is None
    assert len(q) == 0


events = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 9)),
        st.tuples(st.just("hb"), st.integers(0, 2), st.integers(0, 4)),
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("routed"), st.integers(0, 2)),
        st.tuples(st.just("not_routed"), st.booleans()),
        st.tuples(st.just("lost"), st.integers(0, 9)),
        st.tuples(st.just("abort"), st.integers(0, 9)),
    ),
    max_size=60,
)


@settings(max_examples=50, deadline=None)
@given(script=events)
def test_every_offered_request_is_in_exactly_one_place(script):
    """Against a model: each request is waiting, in flight or done (routed / aborted), never
    lost or duplicated; dispatch never overspends the headroom and follows the policy order,
    after asking again about the requests whose route answer was lost (in the order lost)."""
    q = make(slots=3, stale=100.0, backoff=0.0)
    state: dict[str, str] = {}
    unsure: list[str] = []
    arrival = {f"r{k}": float(k) for k in range(10)}
    for step, ev in enumerate(script):
        now = float(step)
        if ev[0] == "offer":
            rid = f"r{ev[1]}"
            expect = state.get(rid) not in ("waiting", "flying")
            assert q.offer(req(rid, arrival_s=arrival[rid]), now) is expect
            if expect:
                state[rid] = "waiting"
        elif ev[0] == "hb":
            q.on_heartbeat(hb(f"w{ev[1]}", waiting=ev[2]), now)
        elif ev[0] == "dispatch":
            room = q.headroom(now)
            waiting = sorted((r for r, s in state.items() if s == "waiting"), key=arrival.__getitem__)
            out = ids(q.dispatchable(now))
            assert out == unsure + waiting[: max(0, room)]
            state.update({r: "flying" for r in out})
            unsure.clear()
        elif ev[0] == "routed" and q.in_flight:
            rid = min(q.in_flight)
            assert q.on_routed(rid, f"w{ev[1]}").request_id == rid
            state[rid] = "done"
        elif ev[0] == "not_routed" and q.in_flight:
            rid = min(q.in_flight)
            q.on_not_routed(rid, now, aborted=ev[1])
            state[rid] = "done" if ev[1] else "waiting"
        elif ev[0] == "lost":  # of a request in flight, or of one that is not (nothing changes)
            flying = sorted(q.in_flight)
            rid = flying[ev[1] % len(flying)] if flying and ev[1] < 7 else f"r{ev[1]}"
            q.on_route_lost(rid, now)
            if state.get(rid) == "flying" and rid not in unsure:
                unsure.append(rid)
        elif ev[0] == "abort":
            rid = f"r{ev[1]}"
            assert (q.abort(rid) is not None) == (state.get(rid) == "waiting")
            if state.get(rid) == "waiting":
                state[rid] = "done"
        assert len(q) == sum(s == "waiting" for s in state.values())
        assert sum(q.depth) == len(q) and sum(q.work) == WORK * len(q)
        unsure[:] = [r for r in unsure if state[r] == "flying"]
        assert set(q.in_flight) == {r for r, s in state.items() if s == "flying"}
        assert list(q.unsure) == unsure


# ───────────────────────────── P0 reserve, stats, drain rate ─────────────────────────────


def classed(rid: str, cls: int, arrival: float = 0.0, prompt_len: int = 8) -> AdmittedRequest:
    return AdmittedRequest(rid, f"inbox.{rid}", "m", [], prompt_len, [], 16, 4, cls, arrival)


def test_p0_is_dispatched_from_its_reserve_once_the_headroom_is_spent():
    from tokenyard.services.priority_queue.policies.registry import make_policy

    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=1, p0_reserve_per_worker=2), make_policy("hybrid"))
    q.on_heartbeat(hb("w0"), 0.0)
    for rid, cls in [("a", 1), ("b", 1), ("z0", 0), ("z1", 0), ("z2", 0)]:
        q.offer(classed(rid, cls), 0.0)
    # one ordinary slot (z0 wins it: P0 is strict), then two reserved slots for P0 only
    assert ids(q.dispatchable(0.0)) == ["z0", "z1", "z2"]
    assert q.dispatchable(0.0) == []
    q.on_routed("z0", "w0")
    q.on_routed("z1", "w0")
    q.on_routed("z2", "w0")
    q.on_heartbeat(hb("w0", waiting=0), 0.1)
    assert ids(q.dispatchable(0.1)) == ["a"]  # P1 only ever gets the ordinary slot


def test_fcfs_has_no_reserve_to_give():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=1, p0_reserve_per_worker=2), FCFS())
    q.on_heartbeat(hb("w0"), 0.0)
    for rid in ("a", "b"):
        q.offer(classed(rid, 0), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a"]


def test_stats_count_waiting_work_per_admitted_class_and_the_drain_rate():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=2, drain_window_s=2.0), FCFS())
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(classed("a", 0, 0.0, prompt_len=10), 0.0)  # cost 14
    q.offer(classed("b", 2, 1.0, prompt_len=100), 0.0)  # cost 104
    q.offer(classed("c", 2, 2.0, prompt_len=20), 0.0)  # cost 24
    s = q.stats("pq-1", 0.0)
    assert (s.depth, s.work_tokens, s.in_flight, s.policy) == ([1, 0, 2, 0], [14, 0, 128, 0], 0, "fcfs")
    assert ids(q.dispatchable(0.0)) == ["a", "b"]
    q.on_routed("a", "w0", now=0.5)
    q.on_routed("b", "w0", now=1.5)
    s = q.stats("pq-1", 2.0)
    assert (s.depth, s.work_tokens, s.in_flight) == ([0, 0, 1, 0], [0, 0, 24, 0], 0)
    # c has waited since the dispatch at 0: 118 tokens routed out of a backlog held for 2 s
    assert (s.drain_tokens_per_s, s.drain_requests_per_s) == (59.0, 1.0)
    assert q.drain_rate(2.5) == (52.0, 0.5)  # a (at 0.5) has left the window
    q.on_not_routed("zz", 3.0)
    assert q.drain_rate(9.0) == (0.0, 0.0)


def test_aborted_and_put_back_requests_keep_the_counts_right():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=1), FCFS())
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(classed("a", 1), 0.0)
    q.offer(classed("b", 3), 0.0)
    q.dispatchable(0.0)
    q.on_not_routed("a", 0.1)
    assert q.depth == [0, 1, 0, 1] and q.work == [0, 12, 0, 12]
    q.abort("b")
    assert q.depth == [0, 1, 0, 0]


def test_a_batch_cap_counts_running_requests_too():
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=8, batch_cap_per_worker=10), FCFS())
    q.on_heartbeat(hb("w0", running=7, waiting=1), 0.0)
    q.on_heartbeat(hb("w1", waiting=3), 0.0)
    assert q.headroom(0.0) == 2 + 5  # w0: min(8 − 1, 10 − 8); w1: min(8 − 3, 10 − 3)
    q.on_heartbeat(hb("w0", running=12), 0.1)  # over its cap: 0
    assert q.headroom(0.1) == 5


# ───────────────────────────── flow control (on by default) ─────────────────────────────


def fhb(wid: str, queued: int = 0, kv_free_blocks: int = 10_000, ms_per_token: float = 0.1, waiting: int = 0,
        tpot_slack_ms: float | None = None):
    """A heartbeat as flow control reads it: 0.1 ms per prompt token → H = 0.25 s is 2500 tokens."""
    return hb(wid, waiting=waiting, queued=queued, free=kv_free_blocks, prefill_ms_per_token=ms_per_token,
              tpot_slack_ms=tpot_slack_ms)


def sized(rid: str, prompt_len: int, arrival: float = 0.0, cls: int = 1) -> AdmittedRequest:
    return AdmittedRequest(rid, f"inbox.{rid}", "m", [], prompt_len, [], 16, 4, cls, arrival)


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


def test_a_request_that_can_no_longer_meet_its_deadline_leaves_with_a_429():
    q = QueueCore(QueueConfig(), FCFS())
    q.offer(sized("p0", 10, 0.0, cls=0), 0.0)  # deadline 0.5 s; leaves once < 0.25 s is left
    q.offer(sized("p1", 10, 0.0, cls=1), 0.0)  # 5 s
    q.offer(sized("p3", 10, 0.0, cls=3), 0.0)  # none
    assert q.expire(0.25) == []
    [(req, rej)] = q.expire(0.26)
    assert req.request_id == "p0" and (rej.status, rej.code, rej.queue_depth) == (429, "deadline_exceeded", 2)
    assert q.stats("pq", 0.26).depth == [0, 1, 0, 1]
    assert ids([r for r, _ in q.expire(1000.0)]) == ["p1"] and len(q) == 1


def test_a_dispatched_request_does_not_expire_and_a_put_back_one_keeps_its_deadline():
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0"), 0.0)
    q.offer(sized("a", 10, 0.0, cls=0), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a"]
    assert q.expire(1.0) == []  # in flight, not waiting
    q.on_not_routed("a", 1.0)
    [(req, _)] = q.expire(1.0)
    assert req.request_id == "a" and len(q) == 0


def test_a_long_prompt_leaves_by_its_deadline_less_its_own_prefill_and_the_engine_backlog():
    """Admission stamps deadline = arrival + class target + predicted prefill (shared.slo); the
    queue must release it by deadline − prefill − 0.25 s, i.e. within its class target."""
    from tokenyard.shared.slo import ttft_deadline_s

    q = QueueCore(QueueConfig(), FCFS())
    long = sized("long", 30000, 0.0, cls=1)
    long.prefill_s = 6.0
    long.deadline_s = ttft_deadline_s(0.0, 1, None, long.prefill_s)  # 11 s
    q.offer(long, 0.0)
    assert q.next_expiry() == 4.75
    assert q.expire(4.75) == []
    [(req, rej)] = q.expire(4.76)
    assert req.request_id == "long" and rej.message.endswith("meet its 11 s TTFT deadline (P1); retry later")


def test_deadline_expiry_can_be_switched_off():
    q = QueueCore(QueueConfig(expire_deadlines=False), FCFS())
    q.offer(sized("a", 10, 0.0, cls=0), 0.0)
    assert q.expire(100.0) == [] and len(q) == 1


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
    assert q.drain_rate(0.2) == (400.0, 4.0)  # no backlog yet: all routed over ≥ 0.25 s
    q.on_heartbeat(hb("w0"), 1.0)
    for rid in ("b", "c"):
        q.offer(classed(rid, 1, 1.0, prompt_len=46), 1.0)  # cost 50 each
    assert ids(q.dispatchable(1.0)) == ["b"]  # c waits: a backlog from 1.0
    q.on_routed("b", "w0", now=1.2)
    # 0.5 s of backlog held, 50 tokens left it (a's 100 routed with nothing waiting do not count)
    assert q.drain_rate(1.5) == (100.0, 2.0)


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
