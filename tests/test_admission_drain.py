"""Admission's sustainable drain (services/admission/feasibility.py, D_s): what the fleet keeps
up once the requests it routes run their decodes, priced from the workers' heartbeats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, Rejected

from tests.builders import hb
from tests.test_admission_limits import admit, core, stats


def decoding_worker(c, wid, *, a=0.1, b=0.0, d=0.001, hits=0, queries=0, now=100.0):
    """A worker whose prompt tokens cost a ms each (+ L²·b), whose decodes cost a + d·context ms a step."""
    c.on_heartbeat(hb(wid, ts=now, prefill_ms_per_token=a, prefill_ms_per_token2=b, decode_ms_per_ctx_token=d,
                      prefix_hits=hits, prefix_queries=queries), now)


def test_a_fresh_engines_drain_is_capped_at_what_the_fleet_sustains_once_the_decodes_run():
    """Early in a burst the queue measures a fresh engine's rate (prefill, few decodes beside);
    the requests it routed still have their decodes to run. A request of P = 1000 prompt and
    M = 100 output tokens costs a worker 0.1·1000 + 100·(0.1 + 0.001·(1000 + 50)) = 215 ms:
    1100 work tokens per 0.215 s, 5,116 per second per worker."""
    c = core()
    for w in ("w0", "w1"):
        decoding_worker(c, w)
    c.on_queue_stats(stats(work=(0, 0, 0, 0), drain=0.0, headroom=10**6), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100)), AdmittedRequest)
    sustained = 2 * 1100 / 0.215
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(sustained)
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=20_000.0), 100.0)  # the fresh rate measured
    # by default a measured drain is trusted (the cap over-refuses short overloads) ...
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 20_000)
    # ... and with the cap on, the fresh rate is capped at what the fleet sustains
    c.fleet.cap_at_sustainable = True
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / sustained)  # 3.2 s, not 1.65 s
    # a measured drain below it is what the fleet does: kept
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=8_000.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 8_000)
    # nothing measured (a burst after a quiet spell): the sustainable drain
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=0.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / sustained)


def test_cached_prompt_tokens_cost_no_prefill_in_the_sustainable_drain():
    """A prefix-heavy fleet drains faster than its prefill rate: with half of the prompt tokens
    found cached, a request costs 0.1·500 + 100·(0.1 + 0.001·1050) = 165 ms."""
    c = core()
    decoding_worker(c, "w0", hits=5_000, queries=10_000)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1100 / 0.165)


def test_the_request_shape_is_a_mean_of_the_requests_admitted_lately():
    c = core()
    decoding_worker(c, "w0", d=0.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.shape == (1000.0, 100.0)
    admit(c, GenerateRequest(prompt="a" * 200, max_tokens=20))
    assert c.fleet.shape == pytest.approx((1000 - 800 / 32, 100 - 80 / 32))
    # a refused request does not count: it will run nowhere
    c.on_queue_stats(stats(work=(0, 10**9, 0, 0), drain=1.0), 100.0)
    before = c.fleet.shape
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 3000, max_tokens=1)), Rejected)
    assert c.fleet.shape == before


def test_without_every_fresh_workers_prefill_cost_the_measured_drain_stands():
    """A vLLM worker reports its prefill cost once it has measured a prefill: until then the
    fleet's sustainable drain is unknown (a sum without it would understate the fleet)."""
    c = core()
    decoding_worker(c, "w0")
    c.on_heartbeat(hb("w1", ts=100.0), 100.0)  # no prefill cost yet
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.sustainable_drain(100.0) is None
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=20_000.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 20_000)
    # once w1 is stale, the fresh fleet is w0 alone, which reports its costs
    decoding_worker(c, "w0", now=101.5)
    assert c.fleet.sustainable_drain(101.5) == pytest.approx(1100 / 0.215)


@settings(max_examples=150, deadline=None)
@given(
    workers=st.lists(st.tuples(st.floats(0.01, 2.0), st.floats(0.0, 1e-4), st.floats(0.0, 0.01),
                               st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=4),
    shapes=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 1000)), min_size=1, max_size=10),
)
def test_the_sustainable_drain_never_computes_faster_than_the_engines(workers, shapes):
    """The tokens the sustainable drain makes the fleet compute — uncached prompt and output, per
    work token — never exceed the engines' linear rate Σ 1000 / a (attention only adds cost)."""
    c = core()
    hits = queries = 0
    for i, (a, b, d, h, q) in enumerate(workers):
        decoding_worker(c, f"w{i}", a=a, b=b, d=d, hits=min(h, q), queries=q)
        hits, queries = hits + min(h, q), queries + q
    c.on_queue_stats(stats(headroom=10**9), 100.0)
    for p, m in shapes:
        assert isinstance(admit(c, GenerateRequest(prompt=[1] * p, max_tokens=m)), AdmittedRequest)
    drain = c.fleet.sustainable_drain(100.0)
    p, m = c.fleet.shape
    computed = p * (1 - hits / queries) if queries else p
    assert drain * (computed + m) / (p + m) <= sum(1000.0 / a for a, *_ in workers) * (1 + 1e-9)


def test_the_decodes_are_priced_at_the_share_of_max_tokens_the_fleet_runs():
    """Requests that ask for 100 tokens and stop after 25 cost 0.1·1000 + 25·(0.1 + 0.001·1012.5)
    = 127.8 ms each, while the queue counts 1100 work tokens of each."""
    c = core()
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=0.1, decode_ms_per_ctx_token=0.001, output_share=0.25), 100.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1100 / (0.1 + 0.025 * (0.1 + 1.0125)))
