"""Bubble placement (services/priority_queue/policies/bubble_placement.py): length ranges that
own instances, split by demand, lent downwards; the queue core's and the router's side of it.

Lengths below are L = prompt + max_tokens: 300 is short ([0, 512)), 1,000 is [512, 2k),
20,000 is long ([8k, ∞)).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.base import WorkerRoom
from tokenyard.services.priority_queue.policies.bubble_placement import (
    HALF_LIFE_S,
    BubblePlacement,
    merge_groups,
    split_counts,
)
from tokenyard.services.priority_queue.policies.registry import make_policy
from tokenyard.services.router.core import Placement, RouterConfig, RouterCore

from tests.builders import hb, req


def short(rid: str, t: float = 0.0, **kw):
    return req(rid, prompt_len=296, max_tokens=4, arrival_s=t, **kw)


def long(rid: str, t: float = 0.0, **kw):
    return req(rid, prompt_len=19_996, max_tokens=4, arrival_s=t, **kw)


def size(r) -> int:
    return r.prompt_len


def rooms(*wids: str, room: int = 4000, backlog: int = 0) -> dict[str, WorkerRoom]:
    return {w: WorkerRoom(room, backlog) for w in wids}


def bubble() -> BubblePlacement:
    p = make_policy("bubble-placed", aging_s=None)
    assert isinstance(p, BubblePlacement)
    return p


# ── the split ──

def test_a_range_under_half_an_instance_merges_with_the_next():
    # shares of 8 instances, the flood-free heavy-tail mix by L: 0.29 / 0.94 / 1.99 / 4.78
    groups = merge_groups([0.29, 0.94, 1.99, 4.78], 8)
    assert [(a, b) for a, b, _ in groups] == [(0, 1), (2, 2), (3, 3)]
    assert groups[0][2] == pytest.approx(1.23)
    assert split_counts([g[2] for g in groups], 8) == [1, 2, 5]


def test_no_more_groups_than_instances():
    groups = merge_groups([0.6, 0.6, 0.4, 0.4], 2)
    assert [(a, b) for a, b, _ in groups] == [(0, 1), (2, 3)]
    assert split_counts([1.2, 0.8], 2) == [1, 1]


def test_every_group_gets_an_instance():
    assert split_counts([0.5, 0.5, 7.0], 8) == [1, 1, 6]
    assert split_counts([3.0, 0.0 + 0.6, 4.4], 8) == [3, 1, 4]


def test_the_split_follows_the_demand_and_keeps_workers_where_it_can():
    p = bubble()
    for i in range(40):  # 40 × 300 = 12,000 L of shorts
        p.push(short(f"s{i}"), 0.0)
    p.push(long("l0"), 0.0)
    rs = rooms("w0", "w1", "w2", "w3")
    out = p.release(rs, {}, size, 0.0)
    # demand 12,000 : 20,000 over 4 instances → shares 1.5 / 0 / 0 / 2.5: two groups, the
    # ranges nobody asked for joining the longer one (a mid-length arrival is kept off the
    # shorts' instances)
    assert p.groups == [(0, 0), (1, 3)]
    assert sorted(p.owner.values()).count(0) == 2 and sorted(p.owner.values()).count(1) == 2
    long_out = [workers for r, workers in out if r.request_id == "l0"]
    assert long_out == [frozenset(w for w, g in p.owner.items() if g == 1)]
    for r, workers in out:
        if r.request_id != "l0":
            assert workers == frozenset(w for w, g in p.owner.items() if g == 0)


def test_no_demand_seen_is_one_shared_group():
    p = bubble()
    p.release(rooms("w0", "w1"), {}, size, 0.0)
    assert p.groups == [(0, 3)] and set(p.owner.values()) == {0}


def test_a_split_that_is_still_a_rounding_stays():
    p = bubble()
    for i in range(40):
        p.push(short(f"s{i}"), 0.0)
    p.push(long("l0"), 0.0)
    rs = rooms("w0", "w1", "w2", "w3")
    p.release(rs, {}, size, 0.0)
    owners, splits = dict(p.owner), p.splits
    p.push(short("s40", 1.0), 1.0)  # shares move a little: 1.53 / 2.47
    p.release(rs, {}, size, 1.0)
    assert p.owner == owners and p.splits == splits


def test_the_shorts_get_the_least_backlogged_workers():
    p = bubble()
    p.push(long("l0"), 0.0)
    rs = {"w0": WorkerRoom(0, 9000), "w1": WorkerRoom(0, 100), "w2": WorkerRoom(0, 5000)}
    p.release(rs, {}, size, 0.0)
    assert set(p.owner.values()) == {0}  # only longs seen: one group
    for i in range(200):  # a short flood: 60,000 L against 20,000 → shares 2.25 / 0.75
        p.push(short(f"s{i}", 1.0), 1.0)
    p.release(rs, {}, size, 1.0)
    assert p.groups == [(0, 0), (1, 3)]
    assert p.owner == {"w0": 1, "w1": 0, "w2": 0}  # w0, the most backlogged, keeps the long range
    for i in range(6):  # then longs again: shares ~0.9 / 2.1 over 3; the long range grows
        p.push(long(f"l{i + 1}", 2.0), 2.0)
    rs = {"w0": WorkerRoom(0, 9000), "w1": WorkerRoom(0, 100), "w2": WorkerRoom(0, 5000)}
    p.release(rs, {}, size, 2.0)
    assert [sum(g == k for g in p.owner.values()) for k in range(len(p.groups))] == [1, 2]
    assert p.owner["w1"] == 0  # the shorts keep the worker with the least backlog


# ── release ──

def test_shorts_go_to_their_own_instances_while_the_long_range_is_full():
    p = bubble()
    for i in range(40):
        p.push(short(f"s{i:02d}"), 0.0)
    for i in range(3):
        p.push(long(f"l{i}"), 0.0)
    rs = rooms("w0", "w1", "w2", "w3", room=1000)
    out = p.release(rs, {}, size, 0.0)
    # demand 12,000 : 60,000 L over 4 → shares 0.67 / 3.33 → one short instance, three long
    longs = {w for w, g in p.owner.items() if g == 1}
    shorts = {w for w, g in p.owner.items() if g == 0}
    assert len(shorts) == 1 and len(longs) == 3
    released = [r.request_id for r, _ in out]
    # the long group's room (3 × 1,000) takes one 19,996-token prompt; the other two park
    assert [r for r in released if r.startswith("l")] == ["l0"]
    # the short group's room (1,000) takes four 296-token prompts (the last overshoots)
    assert [r for r in released if r.startswith("s")] == ["s00", "s01", "s02", "s03"]
    assert len(p) == 43 - 5
    assert all(w == frozenset(shorts) for r, w in out if r.request_id.startswith("s"))
    assert all(w == frozenset(longs) for r, w in out if r.request_id.startswith("l"))


def test_an_idle_longer_group_lends_its_room_to_shorter_ones_never_the_reverse():
    p = bubble()
    for i in range(40):
        p.push(short(f"s{i}"), 0.0)
    p.push(long("l0"), 0.0)
    rs = rooms("w0", "w1", "w2", "w3", room=1000)
    in_flight = {}
    out = p.release(rs, in_flight, size, 0.0)
    longs = frozenset(w for w, g in p.owner.items() if g == 1)
    shorts = frozenset(w for w, g in p.owner.items() if g == 0)
    assert [w for r, w in out if r.request_id == "l0"] == [longs]
    # l0 in flight takes the long group's room; next round the long group is idle but full
    in_flight = {r.request_id: r for r, _ in out}
    assert p.release(rs, in_flight, size, 0.0) == []
    # routed: the long group has room again and nothing parked: it lends it to the shorts
    out = p.release(rs, {}, size, 0.0)
    lent = [w for r, w in out if w == shorts | longs]
    assert lent and all(r.request_id.startswith("s") for r, _ in out)
    # a long request parked while the shorts' room is spare never goes to a short instance
    p.push(long("l1", 1.0), 1.0)
    p.push(long("l2", 1.0), 1.0)
    p.release(rooms("w0", "w1", "w2", "w3", room=0), {}, size, 1.0)  # the split follows: now 1 / 3
    longs = frozenset(w for w, g in p.owner.items() if g == 1)
    shorts = frozenset(w for w, g in p.owner.items() if g == 0)
    assert (len(shorts), len(longs)) == (1, 3)
    out = p.release({**{w: WorkerRoom(0, 30_000) for w in longs}, **{w: WorkerRoom(50_000, 0) for w in shorts}},
                    {}, size, 1.0)
    assert out and all(r.request_id.startswith("s") and w == shorts for r, w in out)
    assert "l1" in p and "l2" in p


def test_a_put_back_request_heads_its_range():
    p = bubble()
    for i in range(10):
        p.push(short(f"s{i}"), 0.0)
    out = p.release(rooms("w0", room=600), {}, size, 0.0)
    assert [r.request_id for r, _ in out] == ["s0", "s1", "s2"]
    p.push(out[1][0], 0.1)  # the router could not place s1
    held = {"s0": out[0][0], "s2": out[2][0]}  # in flight: 592 of the 600 tokens of room
    out = p.release(rooms("w0", room=600), held, size, 0.2)
    assert [r.request_id for r, _ in out] == ["s1"]  # before s3, in the 8 tokens left
    out = p.release(rooms("w0", room=600), {}, size, 0.3)
    assert [r.request_id for r, _ in out] == ["s3", "s4", "s5"]


def test_p0_leaves_first_within_its_range():
    p = bubble()
    for i in range(5):
        p.push(short(f"s{i}", priority=1), 0.0)
    p.release(rooms("w0", room=0), {}, size, 0.0)  # no room: nothing leaves (nothing popped)
    p.push(short("p0", 0.5, priority=0), 0.5)
    out = p.release(rooms("w0", room=300), {}, size, 1.0)
    assert [r.request_id for r, _ in out] == ["p0", "s0"]


def test_demand_decays_with_its_half_life():
    p = bubble()
    p.push(short("s0"), 0.0)
    p.push(long("l0"), 0.0)
    a = p.shares(4, 0.0)
    assert a[0] == pytest.approx(4 * 300 / 20_300) and a[3] == pytest.approx(4 * 20_000 / 20_300)
    p.push(short("s1", HALF_LIFE_S), HALF_LIFE_S)  # the first two count half now
    b = p.shares(4, HALF_LIFE_S)
    assert b[0] == pytest.approx(4 * 450 / 10_450)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["s", "m", "l"]), st.integers(0, 3),
                          st.lists(st.integers(-2000, 6000), min_size=1, max_size=5)), min_size=1, max_size=60))
def test_every_request_leaves_once_within_its_own_or_a_longer_group(ops):
    """Conservation and the lending rule, under any room: every request pushed is released
    exactly once (once room lasts), to a non-empty set of known workers drawn from its own
    group and longer ones."""
    p = bubble()
    lengths = {"s": (296, 4), "m": (996, 4), "l": (19_996, 4)}
    pushed, released = [], []
    wids = ["w0", "w1", "w2", "w3", "w4"]
    t = 0.0
    for n, (kind, cls, room_list) in enumerate(ops):
        t += 0.1
        prompt, out_tokens = lengths[kind]
        r = req(f"{kind}{n}", prompt_len=prompt, max_tokens=out_tokens, priority=cls, arrival_s=t)
        p.push(r, t)
        pushed.append(r.request_id)
        rs = {w: WorkerRoom(room_list[i % len(room_list)], 0) for i, w in enumerate(wids)}
        for got, workers in p.release(rs, {}, size, t):
            released.append(got.request_id)
            assert workers and workers <= set(wids)
            g = p.group_of(got)
            assert all(p.owner[w] >= g for w in workers)
        assert len(p) + len(released) == len(pushed)
    while len(p):
        t += 1.0
        before = len(p)
        released += [r.request_id for r, _ in p.release(rooms(*wids, room=50_000), {}, size, t)]
        assert len(p) < before
    assert sorted(released) == sorted(pushed)


# ── the queue core and the router ──

def test_the_queue_core_names_where_each_release_may_go():
    q = QueueCore(QueueConfig(), make_policy("bubble-placed"))
    for w in ("w0", "w1", "w2", "w3"):
        q.on_heartbeat(hb(w, prefill_ms_per_token=0.1), 0.0)  # room: 0.25 s / 0.1 ms = 2,500 tokens
    for i in range(40):
        q.offer(short(f"s{i}"), 0.0)
    q.offer(long("l0"), 0.0)
    out = q.dispatchable(0.0)
    assert {r.request_id for r in out} >= {"l0", "s0"}
    assert set(q.placed_on) == {r.request_id for r in out}
    assert len(q.placed_on["l0"]) == 2 and q.placed_on["l0"].isdisjoint(q.placed_on["s0"])
    q.on_routed("l0", sorted(q.placed_on["l0"])[0], 0.0)
    q.on_not_routed("s0", 0.0)
    assert "l0" not in q.placed_on and "s0" not in q.placed_on and "s0" in q.policy


def test_flow_control_off_places_nothing():
    q = QueueCore(QueueConfig(flow_control=False), make_policy("bubble-placed"))
    q.on_heartbeat(hb("w0"), 0.0)
    q.offer(short("s0"), 0.0)
    assert [r.request_id for r in q.dispatchable(0.0)] == ["s0"] and q.placed_on == {}


def test_the_router_keeps_to_the_placement():
    core = RouterCore(RouterConfig())
    core.on_heartbeat(hb("w0"), 0.0)
    core.on_heartbeat(hb("w1", queued=50_000), 0.0)  # far the worse choice
    assert Placement(core, short("a")).next(0.0).worker_id == "w0"
    assert Placement(core, short("b"), only=frozenset({"w1"})).next(0.0).worker_id == "w1"
    p = Placement(core, short("c"), only=frozenset({"w9"}))  # a worker the router does not know
    assert p.next(0.0) is None and p.reason


def test_in_the_simulator_every_request_runs_where_it_was_placed():
    from tokenyard.loadgen.workloads.heavy_tail import SHARES, HeavyTailWorkload
    from tokenyard.simulator.cluster import ClusterSim, SimConfig

    rates = [16 * s for s in SHARES]
    rates[0] += 40  # a short flood, 15 s of it
    w = HeavyTailWorkload(round(sum(rates) * 15), rate=sum(rates), seed=1, shares=rates)

    class Checked(ClusterSim):
        def place(self, r, now):
            self.allowed[r.request_id] = self.queue.placed_on.get(r.request_id)
            super().place(r, now)

        def start(self, inst, r, now):
            self.where[r.request_id] = (inst.id, self.allowed[r.request_id])
            super().start(inst, r, now)

    sim = Checked(SimConfig(instances=4, queue_policy="bubble-placed", slo_check=False, deadline_reject=False),
                  w.block_tokens)
    sim.where, sim.allowed = {}, {}
    sim.run(w.items())
    assert all(st.finished for st in sim.reqs.values())
    assert sim.where and all(a is None or i in a for i, a in sim.where.values())
    assert sum(a is not None for _, a in sim.where.values()) > 0.9 * len(sim.where)
    policy = sim.queue.policy
    assert isinstance(policy, BubblePlacement) and policy.splits >= 1 and len(policy.groups) >= 2
    assert math.isfinite(sum(policy.shares(4, sim.now)))


# ── aging: a parked request climbs as it would have in the wrapped scheduler ──

def test_a_parked_low_class_ages_past_a_stream_of_parked_higher_ones():
    """A P3 short put back (released, not placed) is parked at its turn; every round parks
    three new P1 shorts ahead of it and the short range's room takes three. It used to wait
    for ever (parked requests kept their class); it ages as in the queue, P3 → P2 after 5 s
    and P2 → P0 after 15 + 30 s, and leaves at 50 s."""
    p = make_policy("bubble-placed")
    assert isinstance(p, BubblePlacement)

    def mid(rid: str, t: float):
        return req(rid, prompt_len=996, max_tokens=4, arrival_s=t)

    p.push(short("low", priority=3), 0.0)
    p.push(mid("m0", 0.0), 0.0)
    for i in range(3):
        p.push(short(f"s0.{i}"), 0.0)
    first = p.release(rooms("w0", "w1", room=5000), {}, size, 0.0)
    assert len(first) == 5
    for r, _ in first:
        if r.request_id != "m0":
            p.push(r, 0.0)  # the router found no room: each is parked at its turn
    shorts_room = {"w0": WorkerRoom(300, 0), "w1": WorkerRoom(1000, 9000)}  # w0 the short range's
    left_at = None
    for t in range(1, 121):
        for i in range(3):
            p.push(short(f"s{t}.{i}", float(t)), float(t))
        p.push(mid(f"m{t}", float(t)), float(t))
        out = p.release(shorts_room, {}, size, float(t))
        assert p.groups == [(0, 0), (1, 3)] and p.owner == {"w0": 0, "w1": 1}
        if any(r.request_id == "low" for r, _ in out):
            left_at = t
            break
        assert len(p.where) == 4  # three P1 shorts and the P3 parked after every round
    assert left_at == 50


@given(cls=st.integers(0, 3), now=st.floats(0, 200))
@settings(max_examples=80, deadline=None)
def test_a_parked_request_ages_by_the_schedulers_own_rule(cls, now):
    """aged_class (what bubble placement applies to parked requests) gives the class the
    hybrid scheduler itself has moved a waiting request into by `now`."""
    from tokenyard.services.priority_queue.policies.base import aged_class
    from tokenyard.services.priority_queue.policies.hybrid import hybrid

    sched = hybrid()
    r = req("r", arrival_s=0.0, priority=cls)
    sched.push(r, 0.0)
    popped = sched.pop_realtime(now)  # ages every waiting request up to now, takes P0
    in_scheduler = 0 if popped is not None else sched.class_of("r")
    assert aged_class(cls, 0.0, now, sched.ages_to)[0] == in_scheduler
