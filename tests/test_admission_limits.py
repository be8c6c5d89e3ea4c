"""Admission's limits: token buckets, tenants and API keys, SLO feasibility, and that a
refusal leaves no state behind."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore, duration
from tokenyard.services.admission.feasibility import FleetView, work_ahead
from tokenyard.services.admission.tenants import TenantPolicy, TenantTable, load_tenants
from tokenyard.services.admission.token_bucket import TokenBucket
from tokenyard.shared.schemas import (
    AdmittedRequest,
    GenerateRequest,
    PriorityClass,
    QueueStats,
    Rejected,
)
from tokenyard.shared.slo import deadline_cap_s
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import hb

# ───────────────────────────── token bucket ─────────────────────────────


def test_a_bucket_starts_full_and_refills_at_its_rate_up_to_its_burst():
    b = TokenBucket(rate=100.0, burst=300.0)
    assert b.level(0.0) == 300.0
    b.take(250.0, 10.0)
    assert b.level(10.0) == 50.0
    assert b.level(11.0) == 150.0
    assert b.level(20.0) == 300.0
    assert b.wait(200.0, 10.0) == 1.5
    assert b.wait(50.0, 10.0) == 0.0
    assert b.wait(301.0, 10.0) == math.inf


def test_checking_a_bucket_changes_nothing():
    b = TokenBucket(rate=10.0, burst=20.0)
    b.take(15.0, 1.0)
    before = copy.deepcopy(b)
    for t in (0.5, 1.0, 2.0, 99.0):
        b.wait(18.0, t)
        b.level(t)
    assert b == before


def test_a_bucket_rejects_nonsense_parameters():
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=5.0)


# ───────────────────────────── tenants ─────────────────────────────

TOML = {
    "global": {"rate": 1000},
    "default": {"ceiling": "P1", "rate": 100, "burst": 200},
    "tenants": {
        "vip": {"ceiling": "P0", "api_keys": ["sk-vip"], "rate": 500},
        "batch": {"pin": "P2", "api_keys": ["sk-b1", "sk-b2"]},
    },
}


def test_load_tenants_fills_defaults():
    t = load_tenants(TOML)
    assert (t.global_rate_tokens_per_s, t.global_burst_tokens) == (1000, 2000)
    assert t.default == TenantPolicy(PriorityClass.P1, PriorityClass.P1, None, 100.0, 200.0)
    assert t.tenants["vip"] == TenantPolicy(PriorityClass.P0, PriorityClass.P1, None, 500.0, 1000.0)
    assert t.tenants["batch"] == TenantPolicy(PriorityClass.P1, PriorityClass.P1, PriorityClass.P2, 100.0, 200.0)
    assert t.api_keys == {"sk-vip": "vip", "sk-b1": "batch", "sk-b2": "batch"}
    assert t.policy("nobody") is t.default


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tenants": {"a": {"ceiling": "P7"}}}, "tenants.a.ceiling must be one of P0..P3"),
        ({"tenants": {"a": {"colour": 1}}}, "tenants.a: unknown keys ['colour']"),
        ({"tenants": {"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}}}, "already given to 'a'"),
    ],
)
def test_bad_tenant_files_are_refused_with_the_place(doc, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_tenants(doc)


def core(table: TenantTable | None = None, **kw) -> AdmissionCore:
    cfg = AdmissionConfig(models=["m1"], max_model_len=4096, block_size=4, default_max_tokens=16,
                          tenants=table, **kw)
    return AdmissionCore(cfg, ByteTokenizer())


def admit(c: AdmissionCore, req: GenerateRequest, headers=None, now: float = 100.0):
    return c.admit(req, reply_to="_INBOX.1", json=False, headers=headers, now=now, new_id="gen-1")


def test_an_api_key_names_the_tenant_and_cannot_be_overridden():
    c = core(load_tenants(TOML))
    out = admit(c, GenerateRequest(prompt="a", priority=-1), {"x-api-key": "sk-vip", "x-tenant": "batch"})
    assert (out.tenant, out.priority) == ("vip", 0)
    out = admit(c, GenerateRequest(prompt="a"), {"x-api-key": "sk-b2", "x-request-tier": "P1"})
    assert (out.tenant, out.priority) == ("batch", 2)  # the tenant's pin comes first
    # Without a key the caller is anonymous: claiming vip (header, field or user) gets the
    # default policy, its ceiling P1, whatever tier it asks for.
    for claim in ({"x-tenant": "vip"}, {}):
        out = admit(c, GenerateRequest(prompt="a", priority=-1, tenant="vip", user="vip"),
                    {**claim, "x-request-tier": "P0"})
        assert (out.tenant, out.priority) == ("", 1)


def test_an_unknown_api_key_is_a_401_when_keys_are_configured():
    out = admit(core(load_tenants(TOML)), GenerateRequest(prompt="a"), {"x-api-key": "sk-nope"})
    assert (out.status, out.code) == (401, "invalid_api_key")
    # with no keys configured, a key is not checked
    assert isinstance(admit(core(), GenerateRequest(prompt="a"), {"x-api-key": "x"}), AdmittedRequest)


# ───────────────────────────── rate limits ─────────────────────────────


def test_a_tenant_over_its_rate_gets_a_429_with_retry_after():
    c = core(TenantTable(default=TenantPolicy(rate_tokens_per_s=10.0, burst_tokens=40.0)))
    first = admit(c, GenerateRequest(prompt="a" * 14, max_tokens=16, tenant="t"), now=0.0)  # costs 30
    assert isinstance(first, AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a" * 14, max_tokens=16, tenant="t"), now=1.0)  # 20 left
    assert out == Rejected(
        "gen-1", 429, "rate_limit_exceeded",
        "Rate limit reached for tenant 't': 10 tokens/s; the request costs 30 tokens (prompt + max_tokens)",
        retry_after_s=1.0, queue_depth=1,
    )
    # another tenant has its own bucket
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 14, max_tokens=16, tenant="u"), now=1.0), AdmittedRequest)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 14, max_tokens=16, tenant="t"), now=2.0), AdmittedRequest)


def test_a_request_the_bucket_can_never_hold_is_a_413():
    c = core(TenantTable(default=TenantPolicy(rate_tokens_per_s=10.0, burst_tokens=40.0)))
    out = admit(c, GenerateRequest(prompt="a" * 30, max_tokens=16))
    assert (out.status, out.code) == (413, "request_too_large")


def test_the_lower_bound_refuses_before_tokenizing():
    # max_tokens alone exceeds what is left: refused although the prompt is not even valid
    c = core(TenantTable(default=TenantPolicy(rate_tokens_per_s=1.0, burst_tokens=40.0)))
    admit(c, GenerateRequest(prompt="a" * 20, max_tokens=16), now=0.0)
    out = admit(c, GenerateRequest(prompt=[1, 10**9], max_tokens=10), now=0.0)
    assert out.status == 429


def test_the_global_bucket_answers_503():
    c = core(TenantTable(global_rate_tokens_per_s=5.0, global_burst_tokens=50.0))
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 24, max_tokens=16), now=0.0), AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a" * 24, max_tokens=16), now=0.0)
    # refused on the lower bound (max_tokens + 1 = 17, before tokenizing): 10 left, 7 short
    assert (out.status, out.code, out.retry_after_s) == (503, "overloaded", 1.4)
    out = admit(c, GenerateRequest(prompt="a" * 24, max_tokens=16), now=2.0)  # 20 left, 40 due
    assert (out.status, out.retry_after_s) == (503, 4.0)


def test_both_buckets_are_charged_together_or_not_at_all():
    table = TenantTable(default=TenantPolicy(rate_tokens_per_s=1.0, burst_tokens=100.0),
                        global_rate_tokens_per_s=1.0, global_burst_tokens=50.0)
    c = core(table)
    out = admit(c, GenerateRequest(prompt="a" * 44, max_tokens=16), now=0.0)  # 60: tenant ok, global not
    assert out.status == 503
    assert c.buckets == {} and c.global_bucket.level(0.0) == 50.0


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


# ───────────────────────────── SLO feasibility ─────────────────────────────


def stats(work=(0, 0, 0, 0), depth=(0, 0, 0, 0), drain=1000.0, headroom=0, policy="hybrid", iid="pq-1"):
    return QueueStats(iid, 0.0, policy, list(depth), list(work), 0, drain, 0.0, headroom)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fcfs", [1500, 1500, 1500, 1500]),
        ("strict", [100, 500, 1300, 1500]),
        # P1: W1 + min(W0, W1·2) + min(W2, W1/2) + min(W3, W1/4) = 400 + 100 + 200 + 100
        ("wfq", [100 + 50 + 25 + 12.5, 400 + 100 + 200 + 100, 800 + 100 + 400 + 200, 200 + 100 + 400 + 400]),
        ("hybrid-wfq", [100, 100 + 400 + 200, 100 + 800 + 400, 1500]),
        # deadline-first fair tier: P1 goes before P2 (its release comes first), P2 after P1
        ("hybrid", [100, 100 + 400, 100 + 400 + 800, 1500]),
        ("bubble", [100, 500, 1300, 1500]),
    ],
)
def test_work_ahead_follows_the_queue_policy(policy, expected):
    assert [work_ahead(policy, [100, 400, 800, 200], c) for c in range(4)] == expected


def test_no_queue_state_no_prediction():
    assert FleetView().judge(0, None, 0.0) is None


def test_a_class_whose_wait_breaks_its_target_is_refused_with_the_queue_depth():
    c = core()
    c.on_queue_stats(stats(work=(0, 6000, 0, 0), depth=(0, 30, 0, 0), drain=1000.0), 100.0)
    # P1: 6000 tokens ahead at 1000 tokens/s = 6 s, + 0.25 s in an engine > 5 s
    out = admit(c, GenerateRequest(prompt="a", priority=1), now=100.0)
    assert out == Rejected(
        "gen-1", 503, "overloaded",
        "Fleet saturated: a P1 request faces a predicted wait of 6.00 s against its 5 s TTFT target "
        "(30 requests queued); retry later",
        retry_after_s=1.25, queue_depth=30,
    )
    # P2 has a 60 s target; P3 none
    assert isinstance(admit(c, GenerateRequest(prompt="a", priority=2), now=100.0), AdmittedRequest)
    assert isinstance(admit(c, GenerateRequest(prompt="a", priority=3), now=100.0), AdmittedRequest)


def test_a_client_deadline_replaces_the_class_target():
    c = core()
    c.on_queue_stats(stats(work=(0, 2000, 0, 0), drain=1000.0), 100.0)
    assert admit(c, GenerateRequest(prompt="a", ttft_slo_ms=1500), now=100.0).status == 503
    ok = admit(c, GenerateRequest(prompt="a", ttft_slo_ms=2500), now=100.0)
    assert ok.deadline_s == 102.5
    assert admit(c, GenerateRequest(prompt="a", ttft_slo_ms=0)).param == "ttft_slo_ms"


def test_a_deadline_no_engine_can_meet_is_a_bad_request_whatever_the_load():
    c = core()
    c.on_queue_stats(stats(work=(0, 2000, 0, 0), drain=1000.0), 100.0)  # a backlog: the wait check would say 503
    tiny = admit(c, GenerateRequest(prompt="a", ttft_slo_ms=5e-324), now=100.0)
    assert (tiny.status, tiny.code, tiny.param) == (400, "slo_infeasible", "ttft_slo_ms")
    assert admit(c, GenerateRequest(prompt="a", ttft_slo_ms=250), now=100.0).status == 400


def test_free_headroom_means_no_wait_and_no_rate_at_all_means_no_prediction():
    c = core()
    c.on_queue_stats(stats(work=(0, 10**6, 0, 0), drain=1.0, headroom=3), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a"), now=100.0), AdmittedRequest)
    c.on_queue_stats(stats(work=(0, 10**6, 0, 0), drain=0.0, headroom=0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a"), now=100.0), AdmittedRequest)


def test_admitted_work_counts_until_the_next_queue_state():
    c = core()
    c.on_queue_stats(stats(work=(0, 4650, 0, 0), depth=(0, 7, 0, 0), drain=1000.0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), now=100.0), AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a"), now=100.0)  # 4650 + 100 → 4.75 s + 0.25 s: still fits
    assert isinstance(out, AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a"), now=100.0)  # 4767 → over
    assert (out.status, out.queue_depth) == (503, 9)
    c.on_queue_stats(stats(work=(0, 0, 0, 0), drain=1000.0), 100.1)
    assert isinstance(admit(c, GenerateRequest(prompt="a"), now=100.1), AdmittedRequest)


def test_admitted_work_the_queue_has_not_taken_in_yet_keeps_counting():
    """A queue state counts only what the queue fetched (up to seen_arrival_s): a burst still in
    JetStream must not vanish from the prediction at each state."""
    c = core()
    c.on_queue_stats(replace(stats(work=(0, 4000, 0, 0), drain=1000.0), seen_arrival_s=99.0), 99.9)
    for t in (100.0, 100.01, 100.02):  # 3 × 100 work: 4300 → 4.3 s + 0.25 s fits
        assert isinstance(admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), now=t), AdmittedRequest)
    # the queue has fetched the first only: its state adds it to its work; the other two still count
    c.on_queue_stats(replace(stats(work=(0, 4100, 0, 0), drain=1000.0), seen_arrival_s=100.0), 100.05)
    assert (c.fleet.admitted_depth, c.fleet.admitted_work[1]) == (2, 200.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 84, max_tokens=16), now=100.06), AdmittedRequest)
    ok = admit(c, GenerateRequest(prompt="a" * 384, max_tokens=16), now=100.07)  # 4400 ahead: fits
    assert isinstance(ok, AdmittedRequest)
    assert admit(c, GenerateRequest(prompt="a"), now=100.08).status == 503  # 4800 → 4.8 + 0.25 s > 5 s
    # (had the state wiped the unfetched two, 4600 ahead would have let it in)
    # once the queue has all of them, nothing is counted twice
    c.on_queue_stats(replace(stats(work=(0, 4800, 0, 0), drain=1000.0), seen_arrival_s=100.07), 100.1)
    assert (c.fleet.admitted_depth, c.fleet.admitted_work, c.fleet.admitted_prompt) == (0, [0.0] * 4, 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 500), st.integers(0, 3)), max_size=40))
def test_the_admitted_sums_equal_the_entries_still_unseen(script):
    f = FleetView()
    now, seen = 0.0, 0.0
    for is_state, x, c in script:
        now += 0.01
        if is_state:
            seen = max(seen, now - x / 1000.0)
            f.on_queue_stats(replace(stats(), seen_arrival_s=seen), now)
        else:
            f.on_admitted(c, float(x), x, now)
        assert all(a > seen for a, *_ in f.admitted)
        assert f.admitted_depth == len(f.admitted)
        assert f.admitted_prompt == sum(p for *_, p in f.admitted)
        for k in range(4):
            assert math.isclose(f.admitted_work[k], sum(w for _, cc, w, _ in f.admitted if cc == k), abs_tol=1e-6)


def test_stale_queue_state_is_ignored_and_replicas_add_up():
    f = FleetView(stale_after_s=1.0)
    f.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=500.0, iid="a"), 0.0)
    f.on_queue_stats(stats(work=(0, 3000, 0, 0), drain=500.0, iid="b"), 0.5)
    assert f.judge(1, None, 0.9).wait_s == 6.0
    f.on_heartbeat(hb("w0", ts=1.1), 1.1)  # a worker is up (else, 1 s on, the fleet has none)
    assert f.judge(1, None, 1.2).wait_s == 6.0  # a is stale: 3000 / 500
    assert f.judge(1, None, 1.6) is None


def test_a_fleet_with_no_healthy_worker_refuses_every_class_with_a_deadline():
    c = core()
    c.on_heartbeat(hb("w0", healthy=False), 100.0)
    c.on_queue_stats(stats(), 100.0)
    out = admit(c, GenerateRequest(prompt="a", priority=2), now=100.0)
    assert (out.status, out.code) == (503, "no_workers")
    assert out.message.startswith("No worker is up (none has been heard from lately, or every one is draining or "
                                  "unhealthy): a P2 request")
    assert out.retry_after_s == c.fleet.stale_after_s
    assert isinstance(admit(c, GenerateRequest(prompt="a", priority=3), now=100.0), AdmittedRequest)
    c.on_heartbeat(hb("w0"), 100.1)
    assert isinstance(admit(c, GenerateRequest(prompt="a", priority=2), now=100.1), AdmittedRequest)


def test_the_slo_check_can_be_turned_off():
    c = core(slo_check=False)
    c.on_queue_stats(stats(work=(0, 10**9, 0, 0), drain=1.0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a"), now=100.0), AdmittedRequest)


# ───────────────────────────── refusals leave nothing behind ─────────────────────────────

requests = st.builds(
    GenerateRequest,
    prompt=st.one_of(st.text(max_size=60), st.lists(st.integers(-2, 300), max_size=20)),
    max_tokens=st.one_of(st.none(), st.integers(-1, 120)),
    priority=st.integers(-1, 4),
    tenant=st.sampled_from(["t", "u", None]),
    ttft_slo_ms=st.one_of(st.none(), st.floats(0.0, 9000.0)),
)


def snapshot(c: AdmissionCore):
    return copy.deepcopy((c.buckets, c.global_bucket, c.fleet))


@settings(max_examples=150, deadline=None)
@given(script=st.lists(st.tuples(requests, st.floats(0.0, 5.0)), max_size=25))
def test_a_refused_request_changes_no_state(script):
    table = TenantTable(default=TenantPolicy(rate_tokens_per_s=40.0, burst_tokens=200.0),
                        global_rate_tokens_per_s=60.0, global_burst_tokens=300.0)
    c = core(table)
    c.on_queue_stats(stats(work=(0, 3000, 20000, 0), drain=1000.0), 0.0)
    now = 0.0
    for req, dt in script:
        now += dt
        before = snapshot(c)
        out = admit(c, req, now=now)
        if isinstance(out, Rejected):
            assert snapshot(c) == before
        else:
            assert c.buckets[out.tenant].level(now) >= 0 and c.global_bucket.level(now) >= 0


def fresh_worker(c, wid="w0", a=0.1, b=0.0, now=100.0):
    """A heartbeat reporting a prefill of L tokens as L·a + L²·b ms."""
    c.on_heartbeat(hb(wid, ts=now, prefill_ms_per_token=a, prefill_ms_per_token2=b), now)


def test_an_idle_fleet_serves_a_prompt_whose_own_prefill_exceeds_its_class_target():
    """The class target bounds the wait; the deadline adds the prompt's own prefill, up to the
    class's cap (shared.slo.deadline_cap_s: P1 8.70 s)."""
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)  # an idle fleet
    fresh_worker(c, a=1.0, b=1e-4)  # 2000 tokens: 2000 + 400 ms; 4000 tokens: 4000 + 1600 ms
    ok = admit(c, GenerateRequest(prompt="a" * 2000), now=100.0)  # P1: 5 s target, 2.4 s prefill
    assert isinstance(ok, AdmittedRequest)
    assert ok.prefill_s == pytest.approx(2.4)
    assert ok.deadline_s == pytest.approx(100.0 + 5.0 + 2.4)
    capped = admit(c, GenerateRequest(prompt="a" * 4000), now=100.0)  # 5.6 s: 10.6 s, capped
    assert capped.prefill_s == pytest.approx(5.6)
    assert capped.deadline_s == pytest.approx(100.0 + deadline_cap_s(1)) and round(capped.deadline_s, 2) == 108.70
    # P3 has no deadline at all
    assert admit(c, GenerateRequest(prompt="a" * 4000, priority=3), now=100.0).deadline_s == 0.0


def test_a_busy_fleet_judges_a_long_prompt_by_its_wait_alone():
    c = core()
    fresh_worker(c, a=1.0, b=1e-4)
    # P1: 4000 tokens ahead at 1000 tokens/s = 4 s + 0.25 s ≤ 5 s, whatever the prompt's own prefill
    c.on_queue_stats(stats(work=(0, 4000, 0, 0), drain=1000.0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 4000), now=100.0), AdmittedRequest)
    c.on_queue_stats(stats(work=(0, 5000, 0, 0), drain=1000.0), 100.0)  # 5 s + 0.25 s > 5 s
    assert admit(c, GenerateRequest(prompt="a"), now=100.0).code == "overloaded"


def test_an_explicit_ttft_slo_is_a_whole_ttft_bound_prefill_included():
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    fresh_worker(c, a=1.0, b=1e-4)  # 4000 tokens: 5.6 s of prefill
    out = admit(c, GenerateRequest(prompt="a" * 4000, ttft_slo_ms=5000), now=100.0)  # 5.6 + 0.25 > 5
    assert (out.status, out.code, out.param) == (400, "slo_infeasible", "prompt")
    assert "5.6 s to prefill" in out.message and "ttft_slo_ms" in out.message
    ok = admit(c, GenerateRequest(prompt="a" * 4000, ttft_slo_ms=6000), now=100.0)
    assert ok.deadline_s == pytest.approx(106.0) and ok.prefill_s == pytest.approx(5.6)
    # with a wait: 0.1 s ahead + 0.25 s + 5.6 s ≤ 6 s fits; 0.2 s ahead does not (503, not 400)
    # (a drain of 500 work tokens/s, below the 715 this worker sustains for such requests)
    c.on_queue_stats(stats(work=(0, 50, 0, 0), drain=500.0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 4000, ttft_slo_ms=6000), now=100.0), AdmittedRequest)
    c.on_queue_stats(stats(work=(0, 100, 0, 0), drain=500.0), 100.0)
    out = admit(c, GenerateRequest(prompt="a" * 4000, ttft_slo_ms=6000), now=100.0)
    assert (out.status, out.code) == (503, "overloaded")
    assert out.retry_after_s == pytest.approx(0.05)


def test_the_fastest_fresh_worker_counts_and_stale_ones_do_not():
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    fresh_worker(c, "slow", a=2.0, now=100.0)
    fresh_worker(c, "fast", a=1.0, now=98.0)  # stale at 100 s
    assert admit(c, GenerateRequest(prompt="a" * 3000), now=100.0).prefill_s == pytest.approx(6.0)
    fresh_worker(c, "fast", a=1.0, now=100.0)
    assert admit(c, GenerateRequest(prompt="a" * 3000), now=100.0).prefill_s == pytest.approx(3.0)


def test_a_burst_spends_the_reported_headroom_then_waits_at_the_workers_prefill_rate():
    """Nothing measured: the rate the worker sustains over a P1's 4.75 s of wait. A request of
    100 prompt and 1,000 output tokens costs 0.1 s of prefill and 1,000 decode tokens of 1 ms,
    a decode lives L = 1 s, and over 4.75 s the decodes of what it takes reach 1 − L/2w of their
    steady state: 1,100 work tokens per 0.1 + 1.0·(1 − 1/9.5) s (at w = ∞, 1,100 per 1.1 s)."""
    c = core()
    fresh_worker(c, "w0", a=1.0)  # 1000 prompt tokens per second
    c.on_queue_stats(stats(work=(0, 0, 0, 0), drain=0.0, headroom=150), 100.0)

    def big(i):  # prompts that share no prefix (a shared one would be cached)
        return GenerateRequest(prompt=chr(ord("a") + i) * 100, max_tokens=1000, priority=1)

    for i in range(2):  # 100 then 200 prompt tokens admitted: the second spends the headroom
        assert isinstance(admit(c, big(i), now=100.0), AdmittedRequest)
    drain = 1100 / (0.1 + 1.0 * (1 - 1 / 9.5))
    assert c.fleet.sustainable_drain(100.0, 4.75) == pytest.approx(drain)
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1000.0)
    for i in range(2, 4):  # 2200 then 3300 work ahead at 1105 tokens/s, + 0.25 s: fits 5 s
        assert isinstance(admit(c, big(i), now=100.0), AdmittedRequest)
    out = admit(c, big(4), now=100.0)  # 4400 → 3.98 s + 0.25 fits; the next does not
    assert isinstance(out, AdmittedRequest)
    out = admit(c, big(5), now=100.0)
    assert (out.status, out.code, out.retry_after_s) == (503, "overloaded", pytest.approx(5500 / drain + 0.25 - 5.0))


def test_a_prompt_whose_prefill_no_workers_decodes_can_absorb_is_refused():
    """The decode-capacity term: a prefill delays every running decode on its worker, so a prompt
    whose own prefill exceeds the TPOT slack of every worker's decodes is a 503 now, with a
    Retry-After of the excess; a worker with nothing decoding takes any prompt."""
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=1.0, tpot_slack_ms=1500.0), 100.0)
    c.on_heartbeat(hb("w1", ts=100.0, prefill_ms_per_token=1.0, tpot_slack_ms=2500.0), 100.0)
    ok = admit(c, GenerateRequest(prompt="a" * 2400), now=100.0)  # 2.4 s ≤ w1's 2.5 s
    assert isinstance(ok, AdmittedRequest)
    out = admit(c, GenerateRequest(prompt="a" * 3000), now=100.0)  # 3 s > 2.5 s
    assert (out.status, out.code) == (503, "overloaded")
    assert out.retry_after_s == pytest.approx(0.5)
    assert "TPOT" in out.message
    # P3 has no deadline: it waits in the queue for room instead
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000, priority=3), now=100.0), AdmittedRequest)
    # a worker whose decodes are done (no slack reported: nothing decodes) takes it
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=1.0), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000), now=100.0), AdmittedRequest)
    # a stale worker's room does not count: at 102 s only w0's new heartbeat is fresh
    c.on_heartbeat(hb("w0", ts=102.0, prefill_ms_per_token=1.0, tpot_slack_ms=1500.0), 102.0)
    assert admit(c, GenerateRequest(prompt="a" * 3000), now=102.0).status == 503


def test_without_prefill_rates_the_decode_term_refuses_nothing():
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    c.on_heartbeat(hb("w0", ts=100.0, tpot_slack_ms=-50.0), 100.0)  # a vLLM worker of old: no rate
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000), now=100.0), AdmittedRequest)


def test_the_decode_room_refusal_names_short_times_in_ms():
    """`bench serve --input-len 512` on a busy fleet read "the 512-token prompt's prefill (about
    0.0 s) … (the most any can absorb now: 0.0 s)": both times rounded away."""
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=1.0, tpot_slack_ms=20.0), 100.0)
    out = admit(c, GenerateRequest(prompt="a" * 35), now=100.0)  # 35 ms of prefill > 20 ms of room
    assert (out.status, out.code) == (503, "overloaded")
    assert "prefill (about 35 ms)" in out.message and "absorb now: 20 ms)" in out.message, out.message
    assert duration(1.25) == "1.2 s" and duration(0.0) == "0 ms"
