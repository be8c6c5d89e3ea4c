"""Admission's sustainable drain (services/admission/feasibility.py, D_s): what the fleet keeps
up once the requests it routes run their decodes, priced from the workers' heartbeats."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.shared.schemas import AdmittedRequest, GenerateRequest, QueueStats, Rejected

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
    # The fresh rate is capped at what the fleet sustains over a P1's wait (4.75 s): its decodes
    # (a lone one lives L = 100 steps of 1.15 ms) reach 1 − L/2w of their steady state by then.
    within = 2 * 1100 / (0.1 + 0.1150 * (1 - 0.115 / (2 * 4.75)))
    assert c.fleet.sustainable_drain(100.0, 4.75) == pytest.approx(within)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / within)  # 3.2 s, not 1.65 s
    # (off: the measured drain is trusted)
    c.fleet.cap_at_sustainable = False
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 20_000)
    c.fleet.cap_at_sustainable = True
    # a measured drain below it is what the fleet does: kept
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=8_000.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 8_000)
    # nothing measured (a burst after a quiet spell): the sustainable drain
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=0.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / within)


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
    computed = min(p * (1 - hits / queries) if queries else p, c.fleet.new_prompt)
    assert drain * (computed + m) / (p + m) <= sum(1000.0 / a for a, *_ in workers) * (1 + 1e-9)


def test_the_decodes_are_priced_at_the_share_of_max_tokens_the_fleet_runs():
    """Requests that ask for 100 tokens and stop after 25 cost 0.1·1000 + 25·(0.1 + 0.001·1012.5)
    = 127.8 ms each, while the queue counts 1100 work tokens of each."""
    c = core()
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=0.1, decode_ms_per_ctx_token=0.001, output_share=0.25), 100.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1100 / (0.1 + 0.025 * (0.1 + 1.0125)))


def test_the_share_of_todays_decodes_still_running_over_a_horizon():
    from tokenyard.services.admission.feasibility import still_decoding

    assert still_decoding(math.inf, 5000.0) == 0.0  # the steady state
    assert still_decoding(4750.0, 0.0) == 0.0
    assert still_decoding(2500.0, 5000.0) == pytest.approx(0.75)  # w = L/2: 1 − 1/4
    assert still_decoding(5000.0, 5000.0) == pytest.approx(0.5)
    assert still_decoding(10_000.0, 5000.0) == pytest.approx(0.25)  # w = 2L: L/2w


def test_decodes_running_now_take_their_share_of_the_horizon():
    """20 decodes run, each step 50 ms: a decode takes 1.15 ms of each, so they hold 46 % of the
    engine now; a new one lives L = 100 × 50 ms = 5 s. Over 4.75 s (x = 0.95) today's decodes
    still run k = 1 − 0.475 = 52.5 % of the time, the new ones reach 47.5 % of their steady
    state: (1 − 20 · 1.15/50 · 0.525) · 1100 / (0.1 + 0.115 · 0.475) work tokens per second."""
    c = core()
    c.on_heartbeat(hb("w0", ts=100.0, running=20, step_time_ms=50.0, prefill_ms_per_token=0.1,
                      decode_ms_per_ctx_token=0.001), 100.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    free = 1 - 20 * 1.15 / 50 * 0.525
    assert c.fleet.sustainable_drain(100.0, 4.75) == pytest.approx(free * 1100 / (0.1 + 0.115 * 0.475))
    # in the steady state the running decodes are the new ones' (none is counted twice)
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1100 / 0.215)


@settings(max_examples=100, deadline=None)
@given(a=st.floats(0.01, 2.0), d=st.floats(0.0, 0.01), p=st.integers(1, 3000), m=st.integers(1, 1000),
       step=st.floats(0.0, 200.0), w1=st.floats(0.01, 100.0), w2=st.floats(0.01, 100.0))
def test_with_nothing_decoding_a_longer_horizon_never_sustains_more(a, d, p, m, step, w1, w2):
    """Nothing runs now: over a longer horizon more of the new decodes run, so the fleet sustains
    no more, and never less than in the steady state."""
    c = core()
    c.on_heartbeat(hb("w0", ts=100.0, running=0, step_time_ms=step, prefill_ms_per_token=a,
                      decode_ms_per_ctx_token=d), 100.0)
    c.on_queue_stats(stats(headroom=10**9), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt=[1] * p, max_tokens=m)), AdmittedRequest)
    short, long = sorted((w1, w2))
    f = c.fleet
    assert f.sustainable_drain(100.0, short) >= f.sustainable_drain(100.0, long) * (1 - 1e-12)
    assert f.sustainable_drain(100.0, long) >= f.sustainable_drain(100.0) * (1 - 1e-12)


def test_a_prompt_a_recent_one_shared_counts_only_its_new_tokens():
    """Admission remembers the prompts it admitted (every 4th block hash; block size 4 here): a
    follow-up of a 1,000-token prompt with 200 new tokens is priced at its ~200 new ones."""
    c = core()
    decoding_worker(c, "w0", d=0.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="ab" * 500, max_tokens=10))
    assert c.fleet.new_prompt == 1000.0
    admit(c, GenerateRequest(prompt="ab" * 500 + "c" * 200, max_tokens=10))
    # 992 shared: 62 sampled hashes of 250 blocks, the last 2 blocks fall between samples
    assert c.fleet.new_prompt == pytest.approx(1000 + (1200 - 992 - 1000) / 32)
    admit(c, GenerateRequest(prompt="x" * 1000, max_tokens=10))  # nothing shared
    assert c.fleet.new_prompt == pytest.approx(975.25 + (1000 - 975.25) / 32)


def test_the_block_memory_is_bounded_by_the_fleets_kv_and_needs_a_worker():
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="ab" * 500, max_tokens=10))
    assert not c.fleet.recent_blocks  # no worker heard from: no cache known to exist
    c.on_heartbeat(hb("w0", ts=100.0, prefill_ms_per_token=0.1, used=0, free=100), 100.0)
    for i in range(10):  # 10 prompts of 250 blocks, 62 of them remembered each
        admit(c, GenerateRequest(prompt=chr(ord("a") + i) * 1000, max_tokens=10))
        assert len(c.fleet.recent_blocks) <= 100 // 4
    # the newest prompt's head is remembered (its tail forgotten first), the older ones are not
    before = c.fleet.new_prompt
    admit(c, GenerateRequest(prompt="j" * 1000, max_tokens=10))
    assert c.fleet.new_prompt == pytest.approx(before + (1000 - 25 * 16 - before) / 32)
    before = c.fleet.new_prompt
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=10))  # the first prompt: forgotten
    assert c.fleet.new_prompt == pytest.approx(before + (1000 - before) / 32)


def test_where_the_model_leaves_no_worker_free_the_measured_drain_decides():
    """100 decodes run on the only worker, each step 50 ms, a decode priced 1.15 ms with the
    newcomer's shape: the model says they hold 2.3 engines' worth — while the engine runs them in
    50 ms steps, so the model is off, not the fleet full. Over a P1's 4.75 s nothing is free by
    the model, and that is not taken as a full fleet (which would refuse every request with
    work ahead): the drain the queue measures decides. A P2's 59.75 s outlives those decodes:
    it is judged on what is free by then."""
    c = core()
    c.on_heartbeat(hb("w0", ts=100.0, running=100, step_time_ms=50.0, prefill_ms_per_token=0.1,
                      decode_ms_per_ctx_token=0.001), 100.0)
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100))
    assert c.fleet.sustainable_drain(100.0, 4.75) is None
    assert c.fleet.sustainable_drain(100.0) == pytest.approx(1100 / 0.215)  # the steady state: all free
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), drain=20_000.0), 100.0)
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(33_000 / 20_000)
    assert isinstance(admit(c, GenerateRequest(prompt="b" * 1000, max_tokens=100, priority=1)), AdmittedRequest)
    assert 0 < c.fleet.judge(2, None, 100.0).wait_s < math.inf


def test_a_worker_gone_silent_stops_counting_in_the_block_memorys_bound():
    """Two workers of 100 blocks each: 200 // 4 = 50 sampled hashes remembered. w1 goes silent
    (w0 keeps beating): past w1's liveness bound only w0's 100 blocks count, 25 hashes."""
    c = core()
    c.on_queue_stats(stats(headroom=10**6), 100.0)
    for w in ("w0", "w1"):
        c.on_heartbeat(hb(w, ts=100.0, prefill_ms_per_token=0.1, used=0, free=100), 100.0)
    for i in range(4):
        admit(c, GenerateRequest(prompt=chr(ord("a") + i) * 1000, max_tokens=10))
    assert len(c.fleet.recent_blocks) == 50
    t = 100.0
    while c.fleet.live.fresh("w1", t):
        t += 0.5
        c.on_heartbeat(hb("w0", ts=t, prefill_ms_per_token=0.1, used=0, free=100), t)
        c.on_queue_stats(stats(headroom=10**6), t)
    assert c.fleet.live.fresh("w0", t)
    admit(c, GenerateRequest(prompt="e" * 1000, max_tokens=10), now=t)
    assert len(c.fleet.recent_blocks) == 25


def test_a_replica_whose_backlog_is_too_young_to_measure_leaves_the_wait_to_the_sustainable_drain():
    """Two queue replicas: one measured a slow drain, the other holds work but has held it too
    briefly to measure one (`drain_measured` False; its 0 is no rate). Their summed drain would be
    the first's alone against both backlogs; admission prices the wait by what the fleet sustains."""
    c = core()
    for w in ("w0", "w1"):
        decoding_worker(c, w)
    c.on_queue_stats(stats(work=(0, 0, 0, 0), drain=0.0, headroom=10**6), 100.0)
    assert isinstance(admit(c, GenerateRequest(prompt="a" * 1000, max_tokens=100)), AdmittedRequest)
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), depth=(0, 30, 0, 0), drain=1000.0, iid="pq-1"), 100.0)
    young = QueueStats("pq-2", 0.0, "hybrid", [0, 30, 0, 0], [0, 33_000, 0, 0], drain_measured=False)
    c.on_queue_stats(young, 100.0)
    within = c.fleet.sustainable_drain(100.0, 4.75)
    assert within > 1000.0
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(66_000 / within)  # not 66 s at the first's 1,000
    c.on_queue_stats(stats(work=(0, 33_000, 0, 0), depth=(0, 30, 0, 0), drain=0.0, iid="pq-2"), 100.0)  # measured: a stall
    assert c.fleet.judge(1, None, 100.0).wait_s == pytest.approx(66_000 / 1000.0)
