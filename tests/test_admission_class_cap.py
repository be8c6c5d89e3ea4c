"""Admission's class cap (shared.slo.deadline_cap_s, fits_class): a prompt whose own prefill on
the fastest worker the fleet has shown leaves no room within 2 × its class target (less the
measured overshoot, and CLASS_MARGIN_S to be released and prefilled) is a 400 that says what
to do, and what it says is admitted; below the cap the deadline is capped
(tests/test_admission_limits.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.feasibility import KNOWN_PREFILL_S
from tokenyard.services.admission.tenants import TenantPolicy, TenantTable
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, PriorityClass, Rejected
from tokenyard.shared.slo import CLASS_MARGIN_S, ENGINE_BACKLOG_S, deadline_cap_s, longest_prompt
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.test_admission_limits import admit, core, fresh_worker, stats


def idle(c, now=100.0):
    c.on_queue_stats(stats(headroom=10**6), now)


def test_a_prompt_whose_own_prefill_leaves_no_room_within_its_class_cap_is_a_400_that_says_what_to_do():
    """A P1 of 8.5 s of prefill cannot answer within 2 × 5 s (less the measured overshoot) with
    CLASS_MARGIN_S to spare: no retry can pass, so 400 slo_infeasible, naming the predicted
    prefill, the class's cap and target, the highest class it fits and the ttft_slo_ms that do."""
    c = core(tenant_ceiling={"vip": PriorityClass.P0})
    idle(c)
    fresh_worker(c, a=2.0, b=1e-4)  # 3000 tokens: 6000 + 900 ms; 3600 tokens: 7200 + 1296 ms
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000), now=100.0), AdmittedRequest)  # 6.9 + 0.5 ≤ 8.70
    out = admit(c, GenerateRequest(prompt="a" * 3600), now=100.0)  # 8.5 + 0.5 > 8.70
    assert (out.status, out.code, out.param, out.reason) == (400, "slo_infeasible", "prompt", "beyond_class_cap")
    assert out.message == (
        "The 3600-token prompt takes about 8.5 s to prefill, beyond what a P1 request may take before its first "
        "token (8.7 s at most, from its 5 s TTFT target); send it at a lower class (x-request-tier: P2) or "
        "with ttft_slo_ms of at least 8800")
    assert out.retry_after_s is None  # not an overload: retrying the same request cannot help
    # what it says to do works: P2 (cap 104 s) and ttft_slo_ms 8800 are both admitted
    assert admit(c, GenerateRequest(prompt="a" * 3600), {"x-request-tier": "P2"}, now=100.0).priority == 2
    ok = admit(c, GenerateRequest(prompt="a" * 3600, ttft_slo_ms=8800), now=100.0)
    assert ok.deadline_s == pytest.approx(108.8)
    assert admit(c, GenerateRequest(prompt="a" * 3600, priority=3), now=100.0).deadline_s == 0.0  # P3: no target
    # P0's cap is 0.87 s: 150 tokens (0.302 s) + 0.5 s fits, 200 (0.404 s) does not — and P1 is
    # the class to name (it fits P1's 8.7 s), not always P2
    vip = {"x-tenant": "vip", "x-request-tier": "P0"}
    assert admit(c, GenerateRequest(prompt="a" * 150), vip, now=100.0).priority == 0
    p0 = admit(c, GenerateRequest(prompt="a" * 200), vip, now=100.0)
    assert (p0.status, p0.code) == (400, "slo_infeasible") and "(x-request-tier: P1) or" in p0.message
    assert admit(c, GenerateRequest(prompt="a" * 200), vip | {"x-request-tier": "P1"}, now=100.0).priority == 1


def test_a_prompt_with_too_little_to_spare_within_the_cap_is_a_400_not_admitted_to_expire():
    """3500 tokens: 8.225 s of prefill. With only H (0.25 s) of margin it was admitted with 0.22 s
    to wait in the queue and expired before its first dispatch (429, retry at once, forever):
    with CLASS_MARGIN_S (2 H) it is the 400 that says what to do."""
    c = core()
    idle(c)
    fresh_worker(c, a=2.0, b=1e-4)
    assert CLASS_MARGIN_S == 2 * ENGINE_BACKLOG_S
    assert 8.225 + ENGINE_BACKLOG_S < deadline_cap_s(1) < 8.225 + CLASS_MARGIN_S  # the band the margin closes
    out = admit(c, GenerateRequest(prompt="a" * 3500), now=100.0)
    assert (out.status, out.code, out.retry_after_s) == (400, "slo_infeasible", None)


@pytest.mark.parametrize(("a", "b"), [(2.0, 1e-4), (0.5, 0.0), (0.0745941, 2.3252e-06)])
def test_the_boundary_own_prefill_plus_the_margin_equal_to_the_cap_is_admitted_one_token_more_is_not(a, b):
    """longest_prompt is where fits_class turns (own + CLASS_MARGIN_S ≤ cap); b = 0 is a vLLM
    heartbeat, which reports no quadratic term (prefill_ms_per_token2 0): linear prediction."""
    c = AdmissionCore(AdmissionConfig(models=["m1"], max_model_len=200_000, block_size=4), ByteTokenizer())
    idle(c)
    fresh_worker(c, a=a, b=b)
    n = longest_prompt(a, b, 1)
    assert (n * a + n * n * b) / 1000 + CLASS_MARGIN_S <= deadline_cap_s(1) < ((n + 1) * a + (n + 1) ** 2 * b) / 1000 + CLASS_MARGIN_S
    assert isinstance(admit(c, GenerateRequest(prompt="a" * n, max_tokens=1), now=100.0), AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a" * (n + 1), max_tokens=1), now=100.0)
    assert (out.status, out.reason) == (400, "beyond_class_cap")


def test_a_vllm_heartbeat_without_the_quadratic_term_predicts_linearly():
    c = core()
    idle(c)
    fresh_worker(c, a=2.2, b=0.0)  # vLLM reports no L² term (prefill_ms_per_token2 0): L × 2.2 ms
    ok = admit(c, GenerateRequest(prompt="a" * 3600, max_tokens=1), now=100.0)  # 7.92 + 0.5 ≤ 8.70
    assert ok.prefill_s == pytest.approx(7.92) and ok.deadline_s == pytest.approx(100.0 + deadline_cap_s(1))
    out = admit(c, GenerateRequest(prompt="a" * 4000, max_tokens=1), now=100.0)  # 8.8 s
    assert (out.status, out.reason) == (400, "beyond_class_cap") and "about 8.8 s" in out.message
    ok = admit(c, GenerateRequest(prompt="a" * 4000, max_tokens=1, priority=2), now=100.0)
    assert isinstance(ok, AdmittedRequest) and ok.deadline_s == pytest.approx(100.0 + 60.0 + 8.8)


def test_a_tenant_pinned_to_its_class_is_not_told_to_change_class():
    """A pinned tenant's x-request-tier is ignored, so naming a class would be advice that cannot
    work: the 400 names only the ttft_slo_ms, and that is admitted."""
    pinned = TenantTable(tenants={"batch": TenantPolicy(pinned_class=PriorityClass.P1)})
    c = core(pinned)
    idle(c)
    fresh_worker(c, a=2.0, b=1e-4)
    out = admit(c, GenerateRequest(prompt="a" * 3600), {"x-tenant": "batch", "x-request-tier": "P2"}, now=100.0)
    assert (out.status, out.code) == (400, "slo_infeasible")
    assert "x-request-tier" not in out.message and out.message.endswith("send it with ttft_slo_ms of at least 8800")
    ok = admit(c, GenerateRequest(prompt="a" * 3600, ttft_slo_ms=8800), {"x-tenant": "batch"}, now=100.0)
    assert isinstance(ok, AdmittedRequest) and ok.priority == 1


def beat(c, now, *workers):
    for wid, a in workers:
        fresh_worker(c, wid, a=a, now=now)
    c.on_tick(now)
    idle(c, now)


def test_on_a_mixed_speed_fleet_the_400_is_judged_on_the_fastest_worker_shown_not_the_one_up_now():
    """A fast (1 ms/token) and a slow (3 ms/token) worker: 3000 tokens take 3 s or 9 s. While the
    fast one is stale it is a 503 with Retry-After (a known worker can serve it), never the 400
    that says no retry can pass; a 400 only once the fleet has not shown that speed for
    KNOWN_PREFILL_S; a prompt beyond the fast one's cap is a 400 throughout."""
    c = core(tenant_ceiling={"vip": PriorityClass.P0})
    beat(c, 100.0, ("fast", 1.0), ("slow", 3.0))
    ok = admit(c, GenerateRequest(prompt="a" * 3000, max_tokens=1), now=100.0)
    assert isinstance(ok, AdmittedRequest) and ok.prefill_s == pytest.approx(3.0)
    t = 100.0
    while t < 160.0:  # the slow one keeps beating, the fast one is silent
        t += 1.0
        beat(c, t, ("slow", 3.0))
    assert not c.fleet.up("fast", t) and c.fleet.up("slow", t)
    out = admit(c, GenerateRequest(prompt="a" * 3000, max_tokens=1), now=t)
    assert (out.status, out.code) == (503, "overloaded") and out.retry_after_s == c.fleet.stale_after_s
    assert "about 9.0 s" in out.message and "(3.0 s) is not up" in out.message
    far = admit(c, GenerateRequest(prompt="a" * 4080, max_tokens=1), now=t)  # 4.08 s fits 8.7 s fast: 503 too
    assert far.status == 503
    vip = {"x-tenant": "vip", "x-request-tier": "P0"}  # P0 (0.87 s): beyond even the fast one
    beyond = admit(c, GenerateRequest(prompt="a" * 3000, max_tokens=1), vip, now=t)
    assert (beyond.status, beyond.reason) == (400, "beyond_class_cap") and "(x-request-tier: P1)" in beyond.message
    t = 100.0 + KNOWN_PREFILL_S + 1.0
    beat(c, t, ("slow", 3.0))
    out = admit(c, GenerateRequest(prompt="a" * 3000, max_tokens=1), now=t)
    assert (out.status, out.reason) == (400, "beyond_class_cap") and "about 9.0 s" in out.message


def test_a_prompt_is_not_refused_for_its_class_cap_while_no_worker_reports_a_prefill_cost():
    c = core()
    idle(c)
    ok = admit(c, GenerateRequest(prompt="a" * 4000), now=100.0)
    assert ok.prefill_s == 0.0 and ok.deadline_s == pytest.approx(105.0)


SUGGESTED = re.compile(r"ttft_slo_ms of at least (\d+)")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4000), st.floats(0.05, 5.0, allow_nan=False), st.integers(0, 2))
def test_the_ttft_slo_ms_either_400_suggests_is_admitted(prompt_len, a, prio):
    """Both 400s (beyond the class cap; a ttft_slo_ms too tight) suggest the least ttft_slo_ms,
    rounded up to 100 ms; the suggestion itself is never refused (round 11's review found
    12.850000000000001 s suggested as 13100, then refused)."""
    c = core(tenant_ceiling={"t": PriorityClass.P0})
    idle(c)
    fresh_worker(c, a=a)
    head = {"x-tenant": "t", "x-request-tier": f"P{prio}"}
    for req in (GenerateRequest(prompt="a" * prompt_len, max_tokens=1),
                GenerateRequest(prompt="a" * prompt_len, max_tokens=1, ttft_slo_ms=300)):
        out = admit(c, req, head, now=100.0)
        if isinstance(out, AdmittedRequest):
            continue
        assert isinstance(out, Rejected) and out.status == 400, out.message
        ms = int(SUGGESTED.search(out.message).group(1))
        again = admit(c, GenerateRequest(prompt="a" * prompt_len, max_tokens=1, ttft_slo_ms=ms), head, now=100.0)
        assert isinstance(again, AdmittedRequest), again.message
        assert ms - 100 < (prompt_len * a / 1000 + ENGINE_BACKLOG_S) * 1000  # the least, to 100 ms


def test_the_explicit_ttft_slo_ms_400_offers_sending_none_only_where_the_class_cap_admits_it():
    c = core()
    idle(c)
    fresh_worker(c, a=2.0, b=1e-4)
    short = admit(c, GenerateRequest(prompt="a" * 1000, ttft_slo_ms=1000), now=100.0)  # 2.1 s: fits P1's cap
    assert short.message.endswith("send ttft_slo_ms of at least 2400, or send none to be held to P1's deadline")
    long = admit(c, GenerateRequest(prompt="a" * 3600, ttft_slo_ms=1000), now=100.0)  # 8.5 s: beyond it
    assert long.message.endswith("send ttft_slo_ms of at least 8800") and "send none" not in long.message
