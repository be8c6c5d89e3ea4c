"""Admission's class cap (shared.slo.deadline_cap_s): a prompt whose own prefill leaves no room
within 2 × its class target (less the measured overshoot) even on an idle fleet is a 400 that
says what to do; below the cap the deadline is capped (tests/test_admission_limits.py)."""

from __future__ import annotations

import pytest
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, PriorityClass

from tests.test_admission_limits import admit, core, fresh_worker, stats


def test_a_prompt_whose_own_prefill_leaves_no_room_within_its_class_cap_is_a_400_that_says_what_to_do():
    """Even on an idle fleet a P1 of 8.7 s of prefill cannot answer within 2 × 5 s (less the
    measured overshoot): no retry can pass, so 400 slo_infeasible, naming the predicted prefill,
    the class's cap and target, a lower class and the ttft_slo_ms that would do."""
    c = core(tenant_ceiling={"vip": PriorityClass.P0})
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    fresh_worker(c, a=2.0, b=1e-4)  # 3000 tokens: 6000 + 900 ms; 3600 tokens: 7200 + 1296 ms
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000), now=100.0), AdmittedRequest)  # 6.9 + 0.25 ≤ 8.70
    out = admit(c, GenerateRequest(prompt="a" * 3600), now=100.0)  # 8.5 + 0.25 > 8.70
    assert (out.status, out.code, out.param) == (400, "slo_infeasible", "prompt")
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
    # P0's cap is 0.87 s: 300 tokens (0.609 s) + 0.25 s fits, 400 (0.816 s) does not
    vip = {"x-tenant": "vip", "x-request-tier": "P0"}
    assert admit(c, GenerateRequest(prompt="a" * 300), vip, now=100.0).priority == 0
    p0 = admit(c, GenerateRequest(prompt="a" * 400), vip, now=100.0)
    assert (p0.status, p0.code) == (400, "slo_infeasible") and "(x-request-tier: P2)" in p0.message


def test_a_prompt_is_not_refused_for_its_class_cap_while_no_worker_reports_a_prefill_cost():
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    ok = admit(c, GenerateRequest(prompt="a" * 4000), now=100.0)
    assert ok.prefill_s == 0.0 and ok.deadline_s == pytest.approx(105.0)
