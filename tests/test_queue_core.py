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


def test_an_abort_in_flight_for_one_reply_subject_stops_that_generation_and_remembers_its_end():
    q = make()
    q.on_heartbeat(hb("w0"), 0.0)
    a = req("a", reply_to="_INBOX.new")
    q.offer(a, 0.0)
    q.dispatchable(0.0)
    assert q.stop("a", reply_to="_INBOX.first", ended=True) is False and q.stopping == {}  # another generation's
    assert q.stop("a", reply_to="_INBOX.new") is True and q.stopping == {"a": False}  # its client's: not ended
    assert q.stop("a", reply_to="_INBOX.new", ended=True) is True and q.stopping == {"a": True}  # admission's 409
    assert q.stop("a") is True and q.stopping == {"a": True}  # a later plain abort: still ended
    assert q.on_not_routed("a", 0.1) is a  # handed back to be dropped, not put back in line
    assert len(q) == 0 and q.in_flight == {} and q.stopping == {}
    assert q.stop("a") is False  # gone


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
    """Against a model: each request is waiting, in flight or done (routed / aborted; one aborted
    in flight leaves when its route places it nowhere), never lost or duplicated; dispatch never overspends the headroom and follows the policy order,
    after asking again about the requests whose route answer was lost (in the order lost)."""
    q = make(slots=3, stale=100.0, backoff=0.0)
    state: dict[str, str] = {}
    unsure: list[str] = []
    stopping: set[str] = set()
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
            stopping.discard(rid)
        elif ev[0] == "not_routed" and q.in_flight:
            rid = min(q.in_flight)
            stopped = rid in stopping
            stopping.discard(rid)
            left = q.on_not_routed(rid, now, aborted=ev[1])
            assert (left is not None) == (stopped and not ev[1])  # a stopped one is handed back to be ended
            state[rid] = "done" if ev[1] or stopped else "waiting"
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
            else:  # as the shell does: one in flight is stopped should its route place it nowhere
                assert q.stop(rid) is (state.get(rid) == "flying")
                if state.get(rid) == "flying":
                    stopping.add(rid)
        assert len(q) == sum(s == "waiting" for s in state.values())
        assert sum(q.depth) == len(q) and sum(q.work) == WORK * len(q)
        unsure[:] = [r for r in unsure if state[r] == "flying"]
        assert set(q.in_flight) == {r for r, s in state.items() if s == "flying"}
        assert list(q.unsure) == unsure
        assert set(q.stopping) == stopping


# ───────────────────────────── P0 reserve, stats, drain rate ─────────────────────────────


def classed(rid: str, cls: int, arrival: float = 0.0, prompt_len: int = 8) -> AdmittedRequest:
    return req(rid, prompt_len, 4, cls, arrival_s=arrival)


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
