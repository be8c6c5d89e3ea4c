"""Admission's per-tenant token buckets are not kept for ever (services/admission/core.py
`on_tick`, BUCKET_SWEEP_S): a bucket that has refilled behaves as a fresh one, so it is dropped."""

from __future__ import annotations

from tokenyard.services.admission.tenants import TenantPolicy, TenantTable
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest

from tests.test_admission_limits import admit, core


def test_a_tenant_bucket_full_again_is_forgotten_and_a_refilling_one_kept():
    """An open fleet (no API keys) with a default rate: every name a client claims gets a
    bucket. One that has refilled is dropped at the next sweep (it was a leak: one bucket per
    name ever claimed, for the process's life); one still refilling keeps its debt."""
    c = core(TenantTable(default=TenantPolicy(rate_tokens_per_s=10.0, burst_tokens=1000.0)))
    for i in range(500):  # 17 tokens each (prompt 1 + max_tokens 16): full again 1.7 s later
        assert isinstance(admit(c, GenerateRequest(prompt="a", max_tokens=16, user=f"u{i}"), now=100.0),
                          AdmittedRequest)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 884, max_tokens=16, user="hot"), now=100.0),
                      AdmittedRequest)  # 900 of 1000: full again at 190 s
    assert len(c.buckets) == 501
    c.on_tick(103.0)
    assert set(c.buckets) == {"hot"}
    assert c.buckets["hot"].level(103.0) == 130.0
    out = admit(c, GenerateRequest(prompt="a" * 200, max_tokens=16, user="hot"), now=103.0)
    assert (out.status, out.code) == (429, "rate_limit_exceeded")  # its debt was kept: 217 > 130
    out = admit(c, GenerateRequest(prompt="a" * 983, max_tokens=16, user="u7"), now=103.0)
    assert isinstance(out, AdmittedRequest)  # forgotten = fresh: the whole burst (1000) again
    c.on_tick(104.0)  # within BUCKET_SWEEP_S of the last sweep: none is looked at
    assert set(c.buckets) == {"hot", "u7"}
