"""Admission's wait with overtaking arrivals (services/admission/feasibility.py, λ(c)): work of a
class the queue serves first keeps arriving while a request waits, so the drain left for it is
D − λ(c), λ(c) counted for no more than the window it was measured over."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.feasibility import (
    ARRIVAL_MIN_SPAN_S,
    ARRIVAL_WINDOW_S,
    FleetView,
    overtaking,
    priority_wait,
    work_ahead,
)
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest

from tests.builders import hb
from tests.test_admission_limits import admit, core, stats

P0 = {"x-request-tier": "P0"}
"""A P0 request needs a tenant that may reach P0: core() gets one through default_ceiling."""


def p0_stream(c, times):
    """P0 requests of 100 work tokens each (84 prompt bytes + 16 max_tokens) admitted at `times`."""
    for t in times:
        out = admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), P0, now=t)
        assert isinstance(out, AdmittedRequest) and out.priority == 0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("strict", [(), (0,), (0, 1), (0, 1, 2)]),
        ("hybrid", [(), (0,), (0,), (0,)]),
        ("bubble", [(), (0,), (0,), (0,)]),
        ("hybrid-wfq", [(), (0,), (0,), (0,)]),
        ("fcfs", [(), (), (), ()]),
        ("wfq", [(), (), (), ()]),
    ],
)
def test_the_classes_that_overtake_follow_the_queue_policy(policy, expected):
    assert [tuple(overtaking(policy, c)) for c in range(4)] == expected


def test_a_p1_waits_for_the_drain_a_stream_of_p0_leaves_it():
    """3,000 P1 work tokens queued at D = 1,000/s: 3.3 s alone (with the 300 P0 tokens just
    admitted ahead). Three P0 requests over 0.5 s are λ = 600/s more work passing it: the drain
    left is 400/s, and 3,300 / 400 = 8.25 s; the P0 rate is counted for no more than T = 2 s,
    (3,300 + 600 · 2) / 1,000 = 4.5 s. A P1 then fits (4.75 s ≤ 5 s) ..."""
    c = core(default_ceiling=0)
    c.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=1000.0), 100.0)
    p0_stream(c, (100.0, 100.25, 100.5))
    assert c.fleet.arrival_rate(range(1), 100.5) == pytest.approx(600.0)
    assert c.fleet.judge(1, None, 100.5).wait_s == pytest.approx(4.5)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 384, max_tokens=16), now=100.5), AdmittedRequest)
    # ... and the next one, 3,700 ahead, does not: (3,700 + 1,200) / 1,000 = 4.9 s + 0.25 s > 5 s,
    # where without the P0 stream (3.7 s) it would
    assert c.fleet.judge(1, None, 100.5).wait_s == pytest.approx(4.9)
    assert priority_wait(3700.0, 1000.0, 0.0) == pytest.approx(3.7)
    assert admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), now=100.5).status == 503
    # P2 is passed by P0 alone: the waiting P1 work is in ahead(2), and a later P1 does not pass
    # it (its release, a minute out, comes after a new P1's only while it has slack)
    assert c.fleet.judge(2, None, 100.5).wait_s == pytest.approx(priority_wait(3700.0, 1000.0, 600.0))


def test_a_short_backlog_is_passed_for_the_whole_wait():
    """Below T, the textbook wait: 600 tokens ahead, 400/s left → 1.5 s (the bounded term, 1.8 s,
    is the larger)."""
    assert priority_wait(600.0, 1000.0, 600.0) == pytest.approx(1.5)
    assert priority_wait(600.0, 1000.0, 0.0) == pytest.approx(0.6)
    # an overtaking rate above the drain: a long wait, not an infinite one
    assert priority_wait(600.0, 1000.0, 1500.0) == pytest.approx((600 + 1500 * ARRIVAL_WINDOW_S) / 1000)


def test_overtaking_counted_over_the_whole_wait_is_the_textbook_form():
    """bench.burst_forecast's `whole-wait`: ahead / (D − λ) however long the wait, infinite
    once λ ≥ D; the fleet's default counts it for T."""
    assert priority_wait(3700.0, 1000.0, 600.0, counted_s=math.inf) == pytest.approx(9.25)
    assert priority_wait(3700.0, 1000.0, 600.0) == pytest.approx(4.9)  # (3,700 + 600·2) / 1,000
    assert priority_wait(600.0, 1000.0, 1500.0, counted_s=math.inf) == math.inf
    assert priority_wait(600.0, 1000.0, 0.0, counted_s=math.inf) == pytest.approx(0.6)
    assert FleetView().overtaking_counted_s == ARRIVAL_WINDOW_S


def test_one_request_is_not_a_rate_and_the_window_forgets():
    c = core(default_ceiling=0)
    c.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=1000.0), 100.0)
    p0_stream(c, (100.0,))
    # 100 tokens over the floor span, not over 0 s
    assert c.fleet.arrival_rate(range(1), 100.0) == pytest.approx(100 / ARRIVAL_MIN_SPAN_S)
    assert c.fleet.arrival_rate(range(1), 101.0) == pytest.approx(100 / 1.0)
    assert c.fleet.arrival_rate(range(1), 100.0 + ARRIVAL_WINDOW_S) == 0.0
    assert not c.fleet.arrivals
    # P1 and later classes are not counted for P1 (FIFO within a class; P2 goes after it)
    c.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=1000.0), 103.0)  # it has taken the P0 in
    c.on_heartbeat(hb("w0", ts=103.0), 103.0)  # a worker is up (else, 1 s on, the fleet has none)
    admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), now=103.0)
    assert c.fleet.arrival_rate(range(1), 103.0) == 0.0
    assert c.fleet.judge(1, None, 103.0).wait_s == pytest.approx((3000 + 100) / 1000)


def test_fcfs_counts_no_overtaking_arrivals():
    c = core(default_ceiling=0)
    c.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=1000.0, policy="fcfs"), 100.0)
    for t in (100.0, 100.25, 100.5):  # (fcfs would refuse a P0 here itself: it waits behind all)
        c.fleet.on_admitted(0, 100.0, 84, t)
    assert c.fleet.judge(1, None, 100.5).wait_s == pytest.approx(3.3)


def test_the_admissions_window_does_not_grow_while_nothing_is_judged():
    """With headroom the wait is 0 and no rate is asked for: the window is still trimmed."""
    c = core(default_ceiling=0)
    c.on_queue_stats(stats(headroom=10**9), 100.0)
    p0_stream(c, [100.0 + 0.01 * i for i in range(1000)])
    assert len(c.fleet.arrivals) <= ARRIVAL_WINDOW_S / 0.01 + 1


SCRIPT = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5000), st.floats(0.0, 0.5)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(SCRIPT, st.sampled_from(["hybrid", "strict", "fcfs", "wfq", "hybrid-wfq", "bubble"]),
       st.integers(0, 3), st.floats(1.0, 10**6), st.lists(st.integers(0, 10**6), min_size=4, max_size=4))
def test_without_overtaking_arrivals_the_prediction_is_todays_and_with_them_it_is_bounded(
        script, policy, c, drain, queued):
    """Without admissions in a class that overtakes c within the window, wait = ahead / D, the
    prediction before λ; with them, ahead / D ≤ wait ≤ (ahead + λ·T) / D."""
    f = FleetView(stale_after_s=math.inf)  # one queue state, judged whenever the script ends
    f.on_queue_stats(stats(work=tuple(queued), drain=drain, policy=policy), 0.0)
    now = 0.0
    for k, cost, dt in script:
        now += dt
        f.on_admitted(k, float(cost), cost, now)
    verdict = f.judge(c, None, now)
    work = [queued[k] + f.admitted_work[k] for k in range(4)]
    ahead = work_ahead(policy, work, c)
    lam = f.arrival_rate(overtaking(policy, c), now)
    if ahead <= 0:
        assert verdict.wait_s == 0.0
    elif lam == 0.0:
        assert verdict.wait_s == ahead / drain
    else:
        assert ahead / drain <= verdict.wait_s <= (ahead + lam * ARRIVAL_WINDOW_S) / drain * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(st.floats(0.0, 10**6), st.floats(1.0, 10**6), st.floats(0.0, 10**6), st.floats(0.0, 10**6))
def test_the_wait_grows_with_the_work_ahead_and_with_the_overtaking_rate(ahead, drain, lam, more):
    assert priority_wait(ahead, drain, lam) <= priority_wait(ahead + more, drain, lam)
    assert priority_wait(ahead, drain, lam) <= priority_wait(ahead, drain, lam + more) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(SCRIPT)
def test_the_arrival_sums_equal_the_admissions_still_in_the_window(script):
    f = FleetView()
    now = 0.0
    for k, cost, dt in script:
        now += dt
        f.on_admitted(k, float(cost), cost, now)
        assert all(t > now - ARRIVAL_WINDOW_S for t, _, _ in f.arrivals)
        for c in range(4):
            assert math.isclose(f.arrival_work[c], sum(w for _, kk, w in f.arrivals if kk == c), abs_tol=1e-6)
