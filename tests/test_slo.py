"""shared.slo: the one TTFT deadline every service and the simulator use."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.shared.slo import (
    CLASS_MARGIN_S,
    ENGINE_BACKLOG_S,
    TTFT_BOUND,
    TTFT_OVERSHOOT,
    TTFT_TARGET_S,
    OfferPrefill,
    deadline_cap_s,
    engine_saturated,
    fits_class,
    latest_release_s,
    longest_prompt,
    min_ttft_slo_ms,
    prefill_budget_s,
    request_deadline_s,
    ttft_deadline_s,
)

from tests import builders

times = st.floats(0.0, 1e9, allow_nan=False)
prefills = st.floats(0.0, 600.0, allow_nan=False)


def test_a_class_target_bounds_the_wait_and_the_prompt_s_own_prefill_is_added():
    assert ttft_deadline_s(100.0, 1) == 105.0
    assert ttft_deadline_s(100.0, 1, prefill_s=2.3) == 107.3
    assert ttft_deadline_s(100.0, 0, prefill_s=0.2) == pytest.approx(100.7)
    assert ttft_deadline_s(100.0, 3, prefill_s=2.0) == math.inf
    assert ttft_deadline_s(100.0, -1) == 100.5  # out-of-range priorities clamp


def test_no_deadline_passes_the_class_cap_so_no_ttft_passes_twice_the_target():
    """The cap is 2 × target ÷ the measured overshoot: P0 0.87 s, P1 8.7 s, P2 104 s, P3 none."""
    assert TTFT_BOUND == 2.0 and TTFT_OVERSHOOT > 1.0
    assert [round(deadline_cap_s(c), 2) for c in range(3)] == [0.87, 8.70, 104.35]
    assert deadline_cap_s(3) == math.inf
    assert ttft_deadline_s(100.0, 1, prefill_s=6.3) == pytest.approx(100.0 + 10.0 / TTFT_OVERSHOOT)
    assert ttft_deadline_s(100.0, 0, prefill_s=2.0) == pytest.approx(100.0 + 1.0 / TTFT_OVERSHOOT)
    assert ttft_deadline_s(100.0, 2, prefill_s=40.0) == 200.0  # 60 + 40 s, within P2's cap
    assert ttft_deadline_s(100.0, 3, prefill_s=600.0) == math.inf
    # a client's own ttft_slo_ms is its target: not capped (its deadline is 1 × it)
    assert ttft_deadline_s(100.0, 1, 30_000.0, prefill_s=20.0) == 130.0


@given(times, st.integers(-2, 2), prefills, st.floats(0.0, 1.0))
def test_a_ttft_within_the_measured_overshoot_of_its_deadline_is_within_twice_its_class_target(
        arrival, prio, prefill, overshoot):
    """Issue 11's claim as the cap makes it: any TTFT ≤ TTFT_OVERSHOOT × its deadline (from
    arrival) is ≤ TTFT_BOUND × the class target, whatever the prompt's prefill; and a request
    `fits_class` admits has CLASS_MARGIN_S to spare before that deadline beyond its prefill."""
    target = TTFT_TARGET_S[min(max(prio, 0), 3)]
    due = ttft_deadline_s(arrival, prio, prefill_s=prefill)
    ttft = overshoot * TTFT_OVERSHOOT * (due - arrival)
    assert ttft <= TTFT_BOUND * target * (1 + 1e-9)
    if fits_class(prefill, prio):
        assert latest_release_s(due, prefill) - arrival >= CLASS_MARGIN_S - ENGINE_BACKLOG_S - 1e-9


def test_fits_class_is_own_prefill_plus_the_margin_within_the_cap_boundary_included():
    cap = deadline_cap_s(1)
    assert CLASS_MARGIN_S == 0.5 and fits_class(cap - CLASS_MARGIN_S, 1)
    assert not fits_class(cap - CLASS_MARGIN_S + 1e-9, 1)
    assert fits_class(1e6, 3) and not fits_class(1.0, 0) and fits_class(0.0, 0)


def test_longest_prompt_per_class_on_the_shipped_profiles():
    """The thresholds README and results-priorities Round 11 quote, computed, not by hand: on a
    simulated worker of each profile (its heartbeat's a = prefill_ms_per_token, b = p3 / 2)."""
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.services.worker.sim.slack import prefill_ms_per_token

    def row(name):
        p = profile(name)
        return [longest_prompt(prefill_ms_per_token(p), p.p3 / 2, c) for c in range(4)]

    assert row("a100-llama3-8b") == [4361, 45457, 195901, None]
    assert row("h100-llama3-8b") == [9505, 72840, 287141, None]
    assert row("l20-codellama34b-tp4") == [831, 15970, 110215, None]
    assert row("h100-qwen3-30b-a3b") == [8210, 60316, 235385, None]
    assert longest_prompt(0.0, 0.0, 1) is None  # a worker that measured nothing: no limit
    assert longest_prompt(2.0, 0.0, 1) == 4097  # vLLM's linear report: (8.696 − 0.5) s ÷ 2 ms = 4097.8


@given(st.floats(0.0, 600.0, allow_nan=False))
def test_the_least_ttft_slo_ms_suggested_is_admitted_and_the_least_to_100_ms(prefill):
    ms = min_ttft_slo_ms(prefill)
    assert ms % 100 == 0 and prefill + ENGINE_BACKLOG_S <= ms / 1000.0
    assert prefill + ENGINE_BACKLOG_S > (ms - 100) / 1000.0 - 1e-9
    assert min_ttft_slo_ms(3300 * 0.0005) == 2000  # 1.65 + 0.25 = 1.9000000000000001: 1900 is refused


def test_an_explicit_ttft_slo_is_the_whole_ttft_prefill_included():
    assert ttft_deadline_s(100.0, 1, 2000.0, prefill_s=6.3) == 102.0
    assert ttft_deadline_s(100.0, 3, 2000.0) == 102.0


@given(times, st.integers(-2, 5), prefills)
def test_the_latest_release_leaves_the_engine_backlog_and_the_prefill_before_the_deadline(arrival, prio, prefill):
    due = ttft_deadline_s(arrival, prio, prefill_s=prefill)
    target = TTFT_TARGET_S[min(max(prio, 0), 3)]
    if math.isinf(target):
        assert math.isinf(due)
        return
    release = latest_release_s(due, prefill)
    if prefill <= deadline_cap_s(prio) - target:  # below the cap: the class's whole wait
        assert math.isclose(release - arrival, target - ENGINE_BACKLOG_S, abs_tol=1e-6)
    else:  # capped: what the cap leaves after the prefill (< 0: no release can make it)
        assert math.isclose(release - arrival, deadline_cap_s(prio) - prefill - ENGINE_BACKLOG_S, abs_tol=1e-6)
    assert due >= arrival + target - 1e-6


def test_a_request_s_deadline_is_the_stamped_one_else_its_class_target():
    r = builders.req("a", 10, 4, 1, arrival_s=50.0, reply_to="inbox")
    assert request_deadline_s(r) == 55.0
    r.deadline_s = 61.5
    assert request_deadline_s(r) == 61.5


@given(st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False)))
def test_the_prefill_budget_is_the_backlog_horizon_capped_by_the_decodes_slack(slack):
    budget = prefill_budget_s(slack)
    assert budget <= ENGINE_BACKLOG_S
    assert budget == (ENGINE_BACKLOG_S if slack is None or slack >= ENGINE_BACKLOG_S else slack)


seconds = st.floats(0.0, 10.0, allow_nan=False)


@given(seconds, seconds, st.one_of(st.none(), st.floats(-1.0, 1.0, allow_nan=False)))
def test_an_engine_is_saturated_by_the_prefill_ahead_or_by_the_whole_backlog_past_the_slack(a, b, slack):
    ahead, backlog = min(a, b), max(a, b)  # what goes before a request is part of the backlog
    got = engine_saturated(ahead, backlog, slack)
    # a request with the whole backlog ahead of it: the one budget rule flow control uses
    assert engine_saturated(backlog, backlog, slack) == (backlog > prefill_budget_s(slack))
    # less ahead never saturates more; the decode term still bounds the whole backlog
    assert got <= engine_saturated(backlog, backlog, slack)
    assert got == (ahead > ENGINE_BACKLOG_S or (slack is not None and backlog > slack))


@given(seconds, seconds, st.one_of(st.none(), st.floats(-1.0, 1.0, allow_nan=False)), seconds, seconds)
def test_a_refusal_is_waived_exactly_where_r_would_recompute_more_elsewhere(a, b, slack, own, elsewhere):
    """engine_saturated's own_s / elsewhere_s (the router's counts): either term refuses
    unless r's first token here comes before its bare recompute elsewhere (round 10: the
    ahead term too); no counts, the rule as before."""
    ahead, backlog = min(a, b), max(a, b)
    got = engine_saturated(ahead, backlog, slack, own, elsewhere)
    assert engine_saturated(ahead, backlog, slack, own, None) == engine_saturated(ahead, backlog, slack)
    assert got <= engine_saturated(ahead, backlog, slack)  # the counts never add a refusal
    assert got == (engine_saturated(ahead, backlog, slack) and ahead + own >= elsewhere)
    # nothing cached anywhere (own = elsewhere): the rule as before
    assert engine_saturated(ahead, backlog, slack, own, own) == engine_saturated(ahead, backlog, slack)


def test_a_request_the_engine_runs_first_is_not_held_back_by_the_backlog_behind_it():
    # 0.4 s of released lower-class prefill, 0.1 s of it ahead of a P0: the P0 is taken
    assert not engine_saturated(0.1, 0.4, None)
    assert engine_saturated(0.4, 0.4, None)
    # the running decodes absorb only 0.3 s more prefill: the P0's would push them past it
    assert engine_saturated(0.1, 0.4, 0.3)


@pytest.mark.parametrize("value", ["1," + "9" * 400, "+1,2", "1_000,2", " 1,2", "1,2,3", "١,2", "-1,2", "1,", ""])
def test_a_hostile_offer_prefill_header_is_ignored_not_a_crash(value):
    """Review of round 9: int() took 400-digit counts (then an OverflowError in the worker's
    float arithmetic failed every such offer), signs, '_' and non-ASCII digits."""
    assert OfferPrefill.parse(value) is None
    assert OfferPrefill.parse("441,2873") == OfferPrefill(441, 2873)
