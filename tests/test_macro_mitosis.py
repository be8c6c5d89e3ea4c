"""Mitosis scaling on constructed utilisation / SLO-violation histories: the decisions of the
pure policy, then the controller applying them (groups, provision ops, drain controls)."""

from __future__ import annotations

import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore, ProvisionOp
from tokenyard.services.macro_instance.mitosis import Decision, Mitosis, MitosisConfig, backlog_late_share
from tokenyard.services.macro_instance.provisioner import LocalProcessProvisioner
from tokenyard.shared.schemas import QueueStats, WorkerControl

from tests.builders import hb

CFG = MitosisConfig(n_lower=2, n_upper=4, grow_window_s=300.0, shrink_window_s=600.0)


def feed(m: Mitosis, mid: str, util: float, violation: float, t0: float, t1: float, step: float = 60.0) -> None:
    t = t0
    while t <= t1:
        m.observe(mid, t, util, violation)
        t += step


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="1 ≤ N_lower < N_upper"):
        MitosisConfig(n_lower=4, n_upper=4)


def test_grow_on_utilisation_only_once_the_window_is_spanned():
    m = Mitosis(CFG)
    feed(m, "m0", 0.9, 0.0, 0.0, 240.0)
    assert m.decide({"m0": ["a", "b"]}, 240.0) == []  # history spans 240 s < 300 s
    feed(m, "m0", 0.9, 0.0, 300.0, 300.0)
    assert m.decide({"m0": ["a", "b"]}, 300.0) == [Decision("grow", "m0")]
    assert m.decide({"m0": ["a", "b"]}, 300.0) == []  # the history restarted


def test_grow_on_slo_violations_at_moderate_utilisation():
    m = Mitosis(CFG)
    feed(m, "m0", 0.5, 0.06, 0.0, 300.0)
    feed(m, "m1", 0.5, 0.05, 0.0, 300.0)  # exactly 5% is not above 5%
    assert m.decide({"m0": ["a"], "m1": ["b"]}, 300.0) == [Decision("grow", "m0")]


def test_the_mean_over_the_window_decides_not_one_sample():
    m = Mitosis(CFG)
    feed(m, "m0", 0.95, 0.0, 0.0, 120.0)  # 3 hot samples
    feed(m, "m0", 0.70, 0.0, 180.0, 300.0)  # 3 cooler: mean (3·0.95 + 3·0.7)/6 = 0.825 < 0.85
    assert m.decide({"m0": ["a"]}, 300.0) == []


def test_split_a_macro_instance_over_n_upper():
    m = Mitosis(CFG)
    assert m.decide({"m0": ["a", "b", "c", "d", "e"]}, 0.0) == [Decision("split", "m0", ("d", "e"))]


def test_shrink_then_merge_into_a_lightly_loaded_neighbour():
    m = Mitosis(CFG)
    feed(m, "m0", 0.5, 0.0, 0.0, 600.0)
    feed(m, "m1", 0.2, 0.0, 0.0, 600.0)
    feed(m, "m2", 0.3, 0.0, 0.0, 600.0)
    groups = {"m0": ["a", "b"], "m1": ["c", "d", "e"], "m2": ["f", "g"]}
    # m1 shrinks to 2 = N_lower; its next neighbour m2 is light and 2 + 2 ≤ 4
    assert m.decide(groups, 600.0) == [Decision("shrink", "m1", ("e",)), Decision("merge", "m1", ("c", "d"), "m2")]


def test_no_merge_when_the_neighbours_are_busy_or_it_would_exceed_n_upper():
    m = Mitosis(CFG)
    feed(m, "m0", 0.6, 0.0, 0.0, 600.0)
    feed(m, "m1", 0.2, 0.0, 0.0, 600.0)
    feed(m, "m2", 0.3, 0.0, 0.0, 600.0)
    groups = {"m0": ["a"], "m1": ["c", "d", "e"], "m2": ["f", "g", "h"]}
    # m2 is light but 2 + 3 > 4; m0 fits but is busy (0.6). m2 itself shrinks (its own cold
    # history) and, at 2 workers, would merge into m1 — but m1 already acted this tick.
    assert m.decide(groups, 600.0) == [Decision("shrink", "m1", ("e",)), Decision("shrink", "m2", ("h",))]


def test_a_cold_group_that_cannot_shrink_merges_into_a_cold_neighbour():
    m = Mitosis(CFG)
    for mid in ("m0", "m1", "m2"):
        feed(m, mid, 0.1, 0.0, 0.0, 600.0)
    # one worker each: none can shrink; m0 joins m1, m2's only neighbour (m1) acted already
    assert m.decide({"m0": ["a"], "m1": ["b"], "m2": ["c"]}, 600.0) == [Decision("merge", "m0", ("a",), "m1")]
    feed(m, "m2", 0.1, 0.0, 600.0, 1200.0)
    feed(m, "m1", 0.1, 0.0, 600.0, 1200.0)
    assert m.decide({"m1": ["b", "a"], "m2": ["c"]}, 1200.0) == [
        Decision("shrink", "m1", ("a",)), Decision("merge", "m1", ("b",), "m2")]


def test_the_fleet_bounds_hold():
    m = Mitosis(MitosisConfig(n_lower=1, n_upper=4, max_workers=2, min_workers=2))
    feed(m, "m0", 0.99, 0.0, 0.0, 600.0)
    feed(m, "m1", 0.01, 0.0, 0.0, 600.0)
    assert m.decide({"m0": ["a"], "m1": ["b"]}, 600.0) == []


def test_a_violation_mean_above_the_growth_level_blocks_a_shrink():
    m = Mitosis(CFG)
    feed(m, "m0", 0.2, 0.10, 0.0, 600.0)  # cold, but 10 % late: grows, never shrinks
    feed(m, "m1", 0.2, 0.05, 0.0, 600.0)  # 5 % is not above 5 %: cold enough to shrink
    assert m.decide({"m0": ["a", "b"], "m1": ["c", "d"]}, 600.0) == [
        Decision("grow", "m0"), Decision("shrink", "m1", ("d",))]


# ───────────── the queue's backlog ─────────────

def qstats(depth: int = 0, work: int = 0, drain: float = 0.0, in_flight: int = 0, headroom: int = 0,
           iid: str = "q0") -> QueueStats:
    """A queue state with all its waiting work in class P1."""
    return QueueStats(iid, 0.0, "fcfs", [0, depth, 0, 0], [0, work, 0, 0], in_flight=in_flight,
                      drain_tokens_per_s=drain, headroom=headroom)


def test_backlog_late_share_counts_what_waits_past_the_ttft_slo():
    # 10 waiting, 10,000 tokens of work, drained at 2,000 tokens/s: the line takes 5 s; with a
    # 2 s TTFT SLO the first 4 leave in time, the last 6 are late; 6 of the 10 + 20 held
    assert backlog_late_share([qstats(10, 10_000, 2_000.0, 20)], 2_000.0) == pytest.approx(6 / 30)
    # the whole line leaves within the SLO: nobody is late
    assert backlog_late_share([qstats(10, 10_000, 5_000.0, 20)], 2_000.0) == 0.0
    # work waits and nothing drains: all of it is late
    assert backlog_late_share([qstats(10, 10_000, 0.0, 0)], 2_000.0) == 1.0
    # a replica with headroom is not the bottleneck
    assert backlog_late_share([qstats(10, 10_000, 0.0, 0, headroom=500)], 2_000.0) == 0.0
    # nor one whose backlog is too young to have measured a drain: its 0 is no rate, not a stall
    young = QueueStats("q0", 0.0, "fcfs", [0, 10, 0, 0], [0, 10_000, 0, 0], drain_measured=False)
    assert backlog_late_share([young], 2_000.0) == 0.0
    # nothing held at all
    assert backlog_late_share([], 2_000.0) == 0.0
    assert backlog_late_share([qstats(in_flight=30)], 2_000.0) == 0.0
    # replicas add up: each one's late requests over everything the fleet holds
    two = [qstats(10, 10_000, 2_000.0, 20, iid="a"), qstats(10, 10_000, 0.0, 0, iid="b")]
    assert backlog_late_share(two, 2_000.0) == pytest.approx((6 + 10) / 40)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10**6), st.floats(0.0, 1e6), st.integers(0, 300),
                               st.integers(0, 5_000)), max_size=4),
       ttft=st.floats(1.0, 1e5))
def test_backlog_late_share_is_a_share_and_grows_as_the_drain_slows(rows, ttft):
    queues = [qstats(n, w if n else 0, d, f, h, iid=str(i)) for i, (n, w, d, f, h) in enumerate(rows)]
    share = backlog_late_share(queues, ttft)
    assert 0.0 <= share <= 1.0
    slower = [msgspec.structs.replace(q, drain_tokens_per_s=q.drain_tokens_per_s / 2) for q in queues]
    assert backlog_late_share(slower, ttft) >= share - 1e-12


# ───────────── the controller applies them ─────────────

def scaling_core(size=2, n_lower=1, n_upper=2) -> MacroCore:
    return MacroCore(MacroConfig(size=size, scaling=MitosisConfig(n_lower=n_lower, n_upper=n_upper, grow_window_s=2.0,
                                                                  shrink_window_s=4.0)))


def tick(c: MacroCore, now: float, util: dict[str, float]):
    member = {w: mid for mid, ws in c.groups.items() for w in ws}
    for w, u in util.items():
        c.on_heartbeat(hb(w, macro_id=member.get(w, ""), compute_util=u), now)
    return c.plan(now)


def test_grow_then_split_through_the_controller():
    c = scaling_core()
    assert tick(c, 0.0, {"a": 0.9, "b": 0.9}).provision == []
    tick(c, 1.0, {"a": 0.9, "b": 0.9})
    p = tick(c, 2.0, {"a": 0.9, "b": 0.9})
    assert p.provision == [ProvisionOp("add", "m0")]
    # the new worker "n" joins m0 (it asked for it) although m0 is full: 3 > N_upper → split
    p = tick(c, 2.5, {"a": 0.9, "b": 0.9, "n": 0.0})
    assert c.groups == {"m0": ["a", "b"], "m1": ["n"]}
    assert [(s.macro_id, s.workers, s.epoch) for s in p.states] == [("m0", ["a", "b"], 2), ("m1", ["n"], 1)]
    assert p.controls == [WorkerControl("n", "mixed", "m1", epoch=1, mode="nodg")]


def test_shrink_drains_and_removes_the_worker_then_merge():
    c = scaling_core(size=3, n_lower=2, n_upper=4)
    for t in (0.0, 2.0):
        tick(c, t, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1})
    assert c.groups == {"m0": ["a", "b", "c"], "m1": ["d"]}
    p = tick(c, 4.0, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1})
    # m0 is cold for 4 s: c is removed; m0 is down to N_lower = 2 and merges into m1 (light, 2 + 1 ≤ 4)
    assert c.groups == {"m1": ["d", "a", "b"]}
    assert p.provision == [ProvisionOp("remove", "m0", "c")]
    assert [(s.macro_id, s.workers, s.epoch) for s in p.states] == [("m0", [], 2), ("m1", ["d", "a", "b"], 2)]
    assert p.controls == [WorkerControl("a", "mixed", "m1", epoch=2, mode="nodg"), WorkerControl("b", "mixed", "m1", epoch=2, mode="nodg"),
                          WorkerControl("c", "mixed", "", drain=True)]
    # c keeps sending heartbeats while it drains: it does not rejoin
    tick(c, 4.5, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1})
    assert c.groups == {"m1": ["d", "a", "b"]}
    c.on_heartbeat(hb("c", draining=True), 4.6)
    assert [x.worker_id for x in c.plan(4.6).controls] == []  # it reports draining: no repeat
    # once silent it is forgotten; should it come back, it would join like any newcomer
    c.plan(10.0)
    assert c.retiring == set()


def test_local_provisioner_command_line():
    p = LocalProcessProvisioner("nats://h:1", profile="h100-llama3-8b", speed=2.0, model="x")
    assert p.command("ws0") == [sys.executable, "-m", "tokenyard.cli", "worker", "--nats", "nats://h:1", "--engine",
                                "sim", "--profile", "h100-llama3-8b", "--speed", "2.0", "--id", "ws0", "--model", "x"]
    p.remove("w9")  # not started by it: nothing to stop
    scorpio = LocalProcessProvisioner("nats://h:1", scheduling="scorpio").command("ws1")
    assert scorpio[-2:] == ["--scheduling", "scorpio"]  # the workers `up --scheduling` asked for
    assert "--scheduling" not in LocalProcessProvisioner("nats://h:1", engine="vllm", scheduling="scorpio").command("w")


@settings(max_examples=40, deadline=None)
@given(utils=st.lists(st.lists(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]), min_size=6, max_size=6),
                      min_size=1, max_size=20),
       size=st.integers(1, 4))
def test_scaling_keeps_groups_a_partition_of_the_serving_workers(utils, size):
    """Whatever the utilisation: each live worker not being removed is in exactly one group,
    no group is empty, a removed worker is in none, and the fleet stays within its bounds."""
    c = MacroCore(MacroConfig(size=size, scaling=MitosisConfig(n_lower=1, n_upper=3, grow_window_s=1.0,
                                                               shrink_window_s=2.0, max_workers=8, min_workers=2)))
    fleet = [f"w{k}" for k in range(4)]
    started = 0
    for t, row in enumerate(utils):
        p = tick(c, float(t), {w: row[k % len(row)] for k, w in enumerate(fleet)})
        for op in p.provision:
            if op.kind == "add":
                fleet.append(f"n{started}")
                started += 1
            else:
                fleet.remove(op.worker_id)
        members = [w for ws in c.groups.values() for w in ws]
        assert len(members) == len(set(members))
        assert all(c.groups.values())
        assert not set(members) & c.retiring
        assert 2 <= len(fleet) <= 8


def test_the_controller_grows_on_a_queue_backlog_the_workers_do_not_show():
    """Flow control keeps the workers within their SLOs and below the growth utilisation while
    the queue holds the backlog: the controller reads the backlog from the queue's state."""
    c = scaling_core()
    backlog = qstats(depth=40, work=80_000, drain=4_000.0, in_flight=20)  # a 20 s line, TTFT SLO 2 s
    for t in (0.0, 1.0):
        c.on_queue_stats(backlog, t)
        assert tick(c, t, {"a": 0.5, "b": 0.5}).provision == []
    c.on_queue_stats(backlog, 2.0)
    assert tick(c, 2.0, {"a": 0.5, "b": 0.5}).provision == [ProvisionOp("add", "m0")]
    assert c.backlog_share == pytest.approx(40 * (1 - 4_000 * 2 / 80_000) / 60)


def test_a_stale_queue_state_is_not_a_backlog():
    c = scaling_core()
    c.on_queue_stats(qstats(depth=40, work=80_000, drain=0.0), 0.0)  # then it fell silent (stale after 3 s)
    for t in (3.5, 4.5, 5.5, 6.5):
        assert tick(c, t, {"a": 0.5, "b": 0.5}).provision == []
    assert c.backlog_share == 0.0


def test_no_shrink_while_the_queue_holds_a_late_backlog():
    c = scaling_core(size=3, n_lower=1, n_upper=4)
    backlog = qstats(depth=40, work=80_000, drain=20_000.0, in_flight=20)  # a 4 s line: half of it late
    cold = {"a": 0.1, "b": 0.1, "c": 0.1}
    ops = []
    for t in range(8):  # cold workers, late backlog: growth only
        c.on_queue_stats(backlog, float(t))
        ops += [op.kind for op in tick(c, float(t), cold).provision]
    assert ops and set(ops) == {"add"}
    assert c.groups["m0"] == ["a", "b", "c"]
    ops = []
    for t in range(8, 16):  # the line is gone (the grow window's mean still holds it for a tick):
        c.on_queue_stats(qstats(in_flight=5), float(t))  # cold over the shrink window, and shrink
        ops += [(op.kind, op.worker_id) for op in tick(c, float(t), cold).provision]
    assert ops == [("add", ""), ("remove", "c")]


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.01, 50.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=1,
                      max_size=300),
       keep=st.floats(10.0, 400.0), window=st.floats(1.0, 400.0))
def test_window_means_from_running_sums_equal_the_means_recomputed(steps, keep, window):
    """History's running sums (and its compaction, made frequent here) give the plain mean of
    the kept samples."""
    from tokenyard.services.macro_instance.mitosis import History

    h, kept, t = History(), [], 0.0
    h.COMPACT_AT = 4
    for dt, u, v in steps:
        t += dt
        h.add(t, u, v, keep)
        kept.append((t, u, v))
        while len(kept) > 1 and t - kept[1][0] >= keep:
            kept.pop(0)
        got = h.mean_over(t, window)
        if t - kept[0][0] < window:
            assert got is None
            continue
        recent = [(u, v) for s, u, v in kept if s >= t - window]
        assert got == pytest.approx((sum(u for u, _ in recent) / len(recent), sum(v for _, v in recent) / len(recent)),
                                    abs=1e-9)
