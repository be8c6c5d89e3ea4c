"""MacroCore.plan: grouping by size, stable membership, stale removal, controls, epochs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.shared.schemas import MacroState, WorkerControl

from tests.builders import hb


def state(mid: str, workers: list[str], epoch: int, ts: float) -> MacroState:
    return MacroState(mid, "nodg", workers, {w: "mixed" for w in workers}, list(workers), epoch, ts)


def ctl(wid: str, mid: str, epoch: int) -> WorkerControl:
    return WorkerControl(wid, "mixed", mid, epoch=epoch, mode="nodg")


def core(size: int = 2, stale: float = 3.0) -> MacroCore:
    return MacroCore(MacroConfig(size=size, mode="nodg", stale_after_s=stale))


def seen(c: MacroCore, now: float, *workers: str) -> None:
    """Heartbeats from workers that report the membership the core gave them (if any)."""
    member = {w: mid for mid, ws in c.groups.items() for w in ws}
    for w in workers:
        c.on_heartbeat(hb(w, macro_id=member.get(w, "")), now)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="unknown mode 'fudg'; known: nodg, ecoserve, pd"):
        MacroCore(MacroConfig(mode="fudg"))
    with pytest.raises(ValueError, match="pd_prefill must leave both roles in a macro-instance of 4: 1 … 3"):
        MacroCore(MacroConfig(size=4, mode="pd", pd_prefill=4))
    with pytest.raises(ValueError, match="macro-instance size must be ≥ 1"):
        MacroCore(MacroConfig(size=0))


def test_no_workers_no_plan():
    p = core().plan(0.0)
    assert (p.states, p.controls) == ([], [])


def test_workers_are_grouped_by_size_in_id_order():
    c = core(size=2)
    for w in ("w2", "w0", "w1"):
        c.on_heartbeat(hb(w), 0.0)
    p = c.plan(1.0)
    assert p.states == [state("m0", ["w0", "w1"], 1, 1.0), state("m1", ["w2"], 1, 1.0)]
    assert p.controls == [ctl("w0", "m0", 1), ctl("w1", "m0", 1), ctl("w2", "m1", 1)]
    assert c.groups == {"m0": ["w0", "w1"], "m1": ["w2"]}


def test_controls_repeat_until_the_worker_reports_the_plan():
    c = core(size=2)
    c.on_heartbeat(hb("w0"), 0.0)
    c.on_heartbeat(hb("w1"), 0.0)
    c.plan(0.0)
    c.on_heartbeat(hb("w0", macro_id="m0"), 0.5)
    p = c.plan(0.5)
    assert p.states == []  # nothing changed
    assert p.controls == [ctl("w1", "m0", 1)]  # w1 has not taken its membership yet
    c.on_heartbeat(hb("w1", macro_id="m0", phase="prefill"), 0.6)  # right group, wrong phase
    assert c.plan(0.6).controls == [ctl("w1", "m0", 1)]
    c.on_heartbeat(hb("w1", macro_id="m0"), 0.7)
    assert c.plan(0.7).controls == []


def test_membership_is_stable_as_workers_join():
    c = core(size=2)
    seen(c, 0.0, "w5", "w7", "w9")
    c.plan(0.0)
    seen(c, 1.0, "w5", "w7", "w9")
    seen(c, 1.0, "w1")  # a newcomer with a smaller id does not reshuffle anyone
    p = c.plan(1.0)
    assert c.groups == {"m0": ["w5", "w7"], "m1": ["w9", "w1"]}
    assert p.states == [state("m1", ["w9", "w1"], 2, 1.0)]
    assert p.controls == [ctl("w1", "m1", 2)]


def test_a_stale_worker_leaves_and_its_place_is_taken():
    c = core(size=2, stale=3.0)
    seen(c, 0.0, "w0", "w1", "w2")
    c.plan(0.0)
    seen(c, 3.0, "w1", "w2")  # w0 silent since 0.0
    assert c.plan(3.0).states == []  # exactly stale_after_s: still alive
    p = c.plan(3.5)
    assert p.states == [state("m0", ["w1"], 2, 3.5)]
    assert p.controls == []
    seen(c, 4.0, "w1", "w2", "w3")
    p = c.plan(4.0)
    assert c.groups == {"m0": ["w1", "w3"], "m1": ["w2"]}
    assert p.states == [state("m0", ["w1", "w3"], 3, 4.0)]
    assert p.controls == [ctl("w3", "m0", 3)]


def test_an_emptied_macro_instance_is_announced_once_then_gone():
    c = core(size=1)
    seen(c, 0.0, "w0", "w1")
    c.plan(0.0)
    seen(c, 5.0, "w0")
    p = c.plan(5.0)
    assert p.states == [MacroState("m1", "nodg", [], {}, [], 2, 5.0)]
    assert c.groups == {"m0": ["w0"]} and "m1" not in c.states
    assert c.plan(5.0).states == []
    # a new worker gets a new id: ids are never reused
    seen(c, 6.0, "w0", "w2")
    p = c.plan(6.0)
    assert p.states == [state("m2", ["w2"], 1, 6.0)]


def test_a_worker_that_comes_back_rejoins():
    c = core(size=2)
    seen(c, 0.0, "w0", "w1")
    c.plan(0.0)
    seen(c, 5.0, "w1")
    assert c.plan(5.0).states == [state("m0", ["w1"], 2, 5.0)]
    c.on_heartbeat(hb("w0", macro_id="m0"), 6.0)  # it still believes it is in m0
    seen(c, 6.0, "w1")
    p = c.plan(6.0)
    assert p.states == [state("m0", ["w1", "w0"], 3, 6.0)]
    assert p.controls == []  # what it reports (m0, mixed) already matches the plan


def test_an_emptied_group_and_a_newcomer_in_one_plan():
    c = core(size=1)
    seen(c, 0.0, "w0", "w1")
    c.plan(0.0)
    seen(c, 5.0, "w0", "w9")  # w1 went silent, w9 arrives
    p = c.plan(5.0)
    assert c.groups == {"m0": ["w0"], "m1": ["w9"]}
    assert p.states == [state("m1", ["w9"], 2, 5.0)]


workers = st.lists(st.sampled_from([f"w{k}" for k in range(8)]), max_size=8, unique=True)


@settings(max_examples=50, deadline=None)
@given(rounds=st.lists(workers, min_size=1, max_size=8), size=st.integers(1, 4))
def test_groups_partition_the_live_workers(rounds, size):
    """After every plan: each live worker is in exactly one group, no group is over size or
    empty, a worker never moves between groups while alive, and epochs only grow."""
    c = core(size=size, stale=0.5)
    where: dict[str, str] = {}
    epochs: dict[str, int] = {}
    for t, alive in enumerate(rounds):
        seen(c, float(t), *alive)
        p = c.plan(float(t))
        members = [w for ws in c.groups.values() for w in ws]
        assert sorted(members) == sorted(alive)
        assert all(0 < len(ws) <= size for ws in c.groups.values())
        for mid, ws in c.groups.items():
            for w in ws:
                if w in where and w in rounds[t - 1] and t > 0:
                    assert where[w] == mid
                where[w] = mid
        for s in p.states:
            assert s.epoch > epochs.get(s.macro_id, 0)
            epochs[s.macro_id] = s.epoch
            assert s.workers == c.groups.get(s.macro_id, [])
