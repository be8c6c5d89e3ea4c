"""EcoServe mode: the constraint check's refusals and the placement order (shared.ecoserve),
and rolling activation's phase plans on small groups (MacroCore, mode ecoserve)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.macro_instance.rolling import RollingConfig
from tokenyard.shared.ecoserve import (
    EcoConfig,
    Refusal,
    WorkerLoad,
    check,
    leaves_prefill,
    place,
    ready_for_prefill,
    refusals,
    saved_slack_ms,
)
from tokenyard.shared.schemas import Heartbeat, MacroState, WorkerControl

from tests import builders

ECO = EcoConfig(ttft_slo_ms=1000.0, tpot_slo_ms=50.0)


# ───────────── constraint check ─────────────

def w(wid="w0", pending=0, c=0.1, slack=None, free=100, running=0, waiting=0, util=0.0) -> WorkerLoad:
    return WorkerLoad(wid, pending, c, slack, free, 16, running, waiting, util)


def test_a_worker_that_fits_passes():
    # T = 0.1 ms × (2000 + 1000) = 300 ms ≤ 1000; slack 400 ≥ 300; ⌈(1000+600)/16⌉ = 100 ≤ 100
    assert check(w(pending=2000, slack=400.0, free=100), 1000, 1000, 600, ECO) == Refusal.OK


def test_ttft_refusal_pending_prefill_plus_this_request_over_the_slo():
    # 0.1 × (9001 + 1000) = 1000.1 ms > 1000
    assert check(w(pending=9001), 1000, 1000, 16, ECO) == Refusal.TTFT
    assert check(w(pending=9000), 1000, 1000, 16, ECO) == Refusal.OK


def test_tpot_refusal_the_saved_slack_does_not_cover_the_prefill():
    # T = 0.1 × (0 + 1000) = 100 ms; slack 99.9 < 100
    assert check(w(slack=99.9), 1000, 1000, 16, ECO) == Refusal.TPOT
    assert check(w(slack=100.0), 1000, 1000, 16, ECO) == Refusal.OK
    assert check(w(slack=None), 1000, 1000, 16, ECO) == Refusal.OK  # nothing decodes: no TPOT at stake


def test_memory_refusal_the_request_kv_does_not_fit():
    # ⌈(1000 + 601) / 16⌉ = 101 blocks > 100 free
    assert check(w(free=100), 1000, 1000, 601, ECO) == Refusal.MEMORY


def test_the_first_failing_constraint_is_reported():
    assert check(w(pending=20000, slack=-1.0, free=0), 10, 10, 10, ECO) == Refusal.TTFT
    assert check(w(slack=-1.0, free=0), 10, 10, 10, ECO) == Refusal.TPOT


def test_refusals_are_vectorised_with_per_worker_new_tokens():
    r = refusals(
        pending_tokens=np.array([0, 0, 9000, 0]),
        ms_per_token=np.array([0.1, 0.1, 0.1, 0.1]),
        slack_ms=np.array([np.nan, 5.0, np.nan, np.nan]),
        kv_free=np.array([100, 100, 100, 1]),
        block_size=np.array([16, 16, 16, 16]),
        new_tokens=np.array([1000, 100, 1001, 0]),
        prompt_len=1000, max_tokens=16, cfg=ECO,
    )
    assert r.tolist() == [Refusal.OK, Refusal.TPOT, Refusal.TTFT, Refusal.MEMORY]


def test_placement_prefers_the_session_worker_then_round_robin_then_least_loaded():
    ws = [w("a", running=3), w("b", running=1), w("c", slack=0.0, running=0)]
    p = place(ws, 100, 100, 16, ECO, cursor=0, last_worker="b")
    assert (p.worker_id, p.how, p.cursor) == ("b", "session", 0)
    p = place(ws, 100, 100, 16, ECO, cursor=2, last_worker="c")  # c refuses (TPOT): round robin from 2 → a
    assert (p.worker_id, p.how, p.cursor) == ("a", "round_robin", 1)
    p = place(ws, 100, 100, 16, ECO, cursor=p.cursor)
    assert (p.worker_id, p.how, p.cursor) == ("b", "round_robin", 2)
    full = [w("a", pending=20000, running=3), w("b", pending=20000, running=1, waiting=1), w("c", free=0)]
    p = place(full, 100, 100, 16, ECO, cursor=1)  # none passes: least loaded, ties by id
    assert (p.worker_id, p.how, p.cursor) == ("c", "least_loaded", 1)
    assert place([], 1, 1, 1, ECO).how == "none"


def test_phase_switch_rules():
    assert leaves_prefill(2, 0.0, ECO) and not leaves_prefill(3, 0.89, ECO) and leaves_prefill(3, 0.9, ECO)
    assert ready_for_prefill(None, 1e9, ECO)
    assert ready_for_prefill(150.0, 100.0, ECO) and not ready_for_prefill(149.9, 100.0, ECO)
    # 9 tokens since the first, 450 ms ago, TPOT SLO 50 ms: the 10th may take 50 ms more
    assert saved_slack_ms(9, 450.0, 50.0) == 50.0
    # issue 13 fix 3: a decode that has just made its first token has a whole TPOT SLO of
    # slack, not 0 (which refused every prefill on its worker)
    assert saved_slack_ms(0, 0.0, 50.0) == 50.0
    # 9 tokens still to come after the next, at 30 ms: 20 ms saved on each
    assert saved_slack_ms(0, 0.0, 50.0, 9, 30.0) == 50.0 + 9 * 20.0


# ───────────── rolling activation ─────────────

def hb(wid, macro="", phase="mixed", waiting=0, util=0.0, slack=None, pending=0, c=0.1) -> Heartbeat:
    return builders.hb(wid, waiting=waiting, queued=pending, phase=phase, macro_id=macro, tpot_slack_ms=slack,
                       compute_util=util, prefill_ms_per_token=c)


def eco_core(size=3) -> MacroCore:
    return MacroCore(MacroConfig(size=size, mode="ecoserve",
                                 rolling=RollingConfig(ECO, min_phase_s=1.0, stagger_s=1.0)))


def report(c: MacroCore, now: float, **over) -> None:
    """Heartbeats from w0…w{n-1} reporting what the core told them; `over` overrides fields."""
    for wid in sorted(c.reported) or ["w0", "w1", "w2"]:
        st_ = next((s for s in c.states.values() if wid in s.workers), None)
        fields = {"macro": st_.macro_id, "phase": st_.phases[wid]} if st_ else {}
        fields.update(over.get(wid, {}))
        c.on_heartbeat(hb(wid, **fields), now)


def phases(c: MacroCore, mid="m0") -> list[str]:
    s = c.states[mid]
    return [s.phases[x] for x in s.workers]


def test_prefill_phases_rotate_round_robin_on_an_idle_group():
    c = eco_core()
    report(c, 0.0)
    p = c.plan(0.0)
    assert p.states == [MacroState("m0", "ecoserve", ["w0", "w1", "w2"],
                                   {"w0": "prefill", "w1": "decode", "w2": "decode"}, ["w0"], 1, 0.0, 1000.0, 50.0)]
    assert p.controls == [WorkerControl("w0", "prefill", "m0", epoch=1, mode="ecoserve"), WorkerControl("w1", "decode", "m0", epoch=1, mode="ecoserve"),
                          WorkerControl("w2", "decode", "m0", epoch=1, mode="ecoserve")]
    report(c, 0.5)
    assert c.plan(0.5).states == []  # w0 holds its phase for min_phase_s
    seen = []
    for t in (1.0, 2.0, 3.0, 4.0):
        report(c, t)
        p = c.plan(t)
        seen.append((p.states[0].accepting, p.states[0].epoch))
    assert seen == [(["w1"], 2), (["w2"], 3), (["w0"], 4), (["w1"], 5)]
    assert p.controls == [WorkerControl("w0", "decode", "m0", epoch=5, mode="ecoserve"), WorkerControl("w1", "prefill", "m0", epoch=5, mode="ecoserve")]


def test_a_backlogged_prefill_worker_keeps_its_phase_and_a_second_one_is_staggered_in():
    c = eco_core()
    report(c, 0.0)
    c.plan(0.0)
    report(c, 1.0, w0={"waiting": 3, "util": 0.5})
    c.plan(1.0)
    assert phases(c) == ["prefill", "prefill", "decode"]
    report(c, 1.5, w0={"waiting": 3, "util": 0.5}, w1={"waiting": 3})
    assert c.plan(1.5).states == []  # the next activation waits stagger_s
    report(c, 2.0, w0={"waiting": 3, "util": 0.5}, w1={"waiting": 3})
    c.plan(2.0)
    assert phases(c) == ["prefill", "prefill", "prefill"]


def test_a_saturated_prefill_worker_hands_over():
    c = eco_core()
    report(c, 0.0)
    c.plan(0.0)
    report(c, 1.0, w0={"waiting": 7, "util": 0.95})
    c.plan(1.0)
    assert phases(c) == ["decode", "prefill", "decode"]


def test_activation_skips_a_worker_whose_slack_does_not_cover_the_prefill_ahead():
    c = eco_core()
    report(c, 0.0)
    c.plan(0.0)
    # prefill ahead = w0's pending 2000 tokens × w1's 0.1 ms = 200 ms; w1 needs 300 ms of slack
    report(c, 1.0, w0={"pending": 2000}, w1={"slack": 299.0}, w2={"slack": 300.0})
    c.plan(1.0)
    assert phases(c) == ["decode", "decode", "prefill"]


def test_nobody_ready_the_prefill_worker_stays():
    c = eco_core()
    report(c, 0.0)
    c.plan(0.0)
    report(c, 1.0, w0={"pending": 10}, w1={"slack": -5.0}, w2={"slack": 1.4})  # need 1.5 ms
    assert c.plan(1.0).states == []
    assert phases(c) == ["prefill", "decode", "decode"]


def test_a_dead_prefill_worker_is_replaced_at_once():
    c = eco_core()
    report(c, 0.0)
    c.plan(0.0)
    for t in (1.0, 2.0, 3.0):
        for wid in ("w1", "w2"):
            st_ = c.states["m0"]
            c.on_heartbeat(hb(wid, "m0", st_.phases[wid]), t)
    p = c.plan(3.5)  # w0 (prefill) silent since 0.0: w1, next in rotation, takes over
    assert p.states == [MacroState("m0", "ecoserve", ["w1", "w2"], {"w1": "prefill", "w2": "decode"}, ["w1"], 2,
                                   3.5, 1000.0, 50.0)]


loads = st.fixed_dictionaries({
    "waiting": st.integers(0, 5), "util": st.sampled_from([0.0, 0.5, 0.95]),
    "slack": st.sampled_from([None, -10.0, 0.0, 50.0, 1e4]), "pending": st.sampled_from([0, 100, 5000]),
})


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 4), n=st.integers(1, 6), ticks=st.lists(st.lists(loads, min_size=6, max_size=6), min_size=1,
                                                                    max_size=12))
def test_every_group_always_has_an_accepting_worker(size, n, ticks):
    """Whatever the loads: after each plan every group accepts on ≥ 1 worker, exactly the
    prefill-phase ones, and a worker changes phase at most once per min_phase_s unless its
    group had no prefill worker left."""
    c = eco_core(size)
    names = [f"w{k}" for k in range(n)]
    last_change: dict[str, float] = {}
    for t, row in enumerate(ticks):
        now = t * 0.5
        for wid, ld in zip(names, row, strict=False):
            st_ = next((s for s in c.states.values() if wid in s.workers), None)
            c.on_heartbeat(hb(wid, st_.macro_id if st_ else "", st_.phases[wid] if st_ else "mixed",
                              ld["waiting"], ld["util"], ld["slack"], ld["pending"]), now)
        before = {x: s.phases[x] for s in c.states.values() for x in s.workers}
        c.plan(now)
        for s in c.states.values():
            assert s.accepting and s.accepting == [x for x in s.workers if s.phases[x] == "prefill"]
            for x in s.workers:
                if x in before and before[x] != s.phases[x]:
                    forced = before[x] == "decode" and not any(before.get(y) == "prefill" for y in s.workers)
                    assert forced or now - last_change.get(x, -1.0) >= 1.0 or x not in last_change
                    last_change[x] = now
