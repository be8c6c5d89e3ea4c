"""Mitosis scaling on constructed utilisation / SLO-violation histories: the decisions of the
pure policy, then the controller applying them (groups, provision ops, drain controls)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore, ProvisionOp
from tokenyard.services.macro_instance.mitosis import Decision, Mitosis, MitosisConfig
from tokenyard.services.macro_instance.provisioner import LocalProcessProvisioner
from tokenyard.shared.schemas import WorkerControl

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


def test_the_fleet_bounds_hold():
    m = Mitosis(MitosisConfig(n_lower=1, n_upper=4, max_workers=2, min_workers=2))
    feed(m, "m0", 0.99, 0.0, 0.0, 600.0)
    feed(m, "m1", 0.01, 0.0, 0.0, 600.0)
    assert m.decide({"m0": ["a"], "m1": ["b"]}, 600.0) == []


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
    assert p.controls == [WorkerControl("n", "mixed", "m1", epoch=1)]


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
    assert p.controls == [WorkerControl("a", "mixed", "m1", epoch=2), WorkerControl("b", "mixed", "m1", epoch=2),
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
