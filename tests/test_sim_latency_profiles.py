"""The simulated engine's latency profiles: the A100 step time is Vidur's model, an empty step and
the zero profile are free, profiles are found by name, and an engine sizes its KV pool from its
profile by default."""

from __future__ import annotations

import pytest
from tokenyard.services.worker.sim import latency
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES


def test_a100_step_time_is_the_vidur_model():
    p = PROFILES["a100-llama3-8b"]
    # data/vidur.json: Vidur's A100 Llama-3-8B linear ops per layer at 616 and 624 tokens
    # (1.4485, 1.497 ms), interpolated at 620 = 8 decodes + 512 + 100 prefill tokens, × 32 layers;
    # attention fit per layer: p0 0.00649837, p1 5.59578e-05, p2 8.79409e-08, p3 1.45325e-07,
    # d0 0.0192919, d2 2.45579e-06 (ms), × 32 layers; overhead 1.2 ms
    linear = 32 * (1.4485 + (1.497 - 1.4485) * 4 / 8)
    chunk = lambda n, k: 32 * (0.00649837 + 5.59578e-05 * n + 8.79409e-08 * n * n / 2 + 1.45325e-07 * n * k)  # noqa: E731
    decode = 32 * (0.0192919 + 2.45579e-06 * 4000)
    expected = (1.2 + linear + chunk(512, 1024) + chunk(100, 0) + decode) / 1000.0
    assert p.step_s(8, 4000, [(512, 1024), (100, 0)]) == pytest.approx(expected, rel=1e-12)
    assert p.step_s(8, 4000, [(512, 1024), (100, 0)]) == pytest.approx(0.0535925254830336, rel=1e-9)  # 53.59 ms
    assert p.step_s(1, 100, []) == pytest.approx((1.2 + 32 * 0.303 + 32 * (0.0192919 + 2.45579e-06 * 100)) / 1000.0, rel=1e-12)
    assert p.step_s(0, 0, [(1, 0)]) == pytest.approx((1.2 + 32 * 0.303 + chunk(1, 0)) / 1000.0, rel=1e-12)


def test_an_empty_step_takes_no_time():
    for p in PROFILES.values():
        assert p.step_s(0, 0, []) == 0.0


def test_the_zero_profile_is_free():
    z = PROFILES["zero"]
    assert z.step_s(100, 10**6, [(4096, 10**5), (7, 0)]) == 0.0


def test_profiles_by_name():
    assert latency.profile("h100-llama3-8b") is PROFILES["h100-llama3-8b"]
    assert set(PROFILES) >= {"a100-llama3-8b", "h100-llama3-8b", "h200-llama3-8b", "zero"}
    with pytest.raises(ValueError, match="unknown profile 'tpu'; known: a100-llama3-8b"):
        latency.profile("tpu")


def test_the_engine_uses_the_profiles_block_count_by_default():
    # (0.9 × 80 GiB − 16.06 GB of bf16 weights) / 128 KiB per token = 467,291 tokens
    core = SimEngineCore(PROFILES["a100-llama3-8b"])
    assert (core.block_size, core.pool.total) == (16, 29_205)
    assert SimEngineCore(PROFILES["a100-llama3-8b"], block_size=512).pool.total == 912


def test_a_steps_ceiling_bounds_every_step_of_at_most_its_tokens():
    """The measured linear ops are not monotone in the token count (a kernel's tiles): on the
    A100 a 543-token step's take 41.41 ms, a 576-token one's 40.02, so a step that schedules
    fewer tokens than it was priced at can cost more. linear_ceiling(T) is the most any T' ≤ T
    costs (beyond the table too), and step_ms_at_most bounds every step of at most T tokens,
    at most those decodes, that context and that attention, to the bit."""
    a100 = PROFILES["a100-llama3-8b"]
    assert (a100.linear(543), a100.linear(544), a100.linear(576)) == pytest.approx((41.414, 41.52, 40.016))
    assert a100.linear_ceiling(576) == a100.linear(544)
    assert a100.linear_ceiling(543) == a100.linear(543)
    for p in PROFILES.values():
        top = 0.0
        for t in range(len(p.linear_ms) + 50):
            top = max(top, p.linear(t))
            assert p.linear_ceiling(t) == top
    # seed 1231 at 12 req/s (test_sim_scorpio_guard): 22 decodes (context 16,438) beside a
    # prompt's last 521 tokens on 1,675 computed ones, a 576-token budget priced against 50 ms
    d, ctx, k = 22, 16438, 1675
    step = lambda n: a100.step_ms(d + n, d, ctx, a100.chunk_attn_ms(n, k))  # noqa: E731
    assert step(554) == pytest.approx(49.072, abs=1e-3) and step(521) == pytest.approx(50.104, abs=1e-3)
    bound = a100.step_ms_at_most(d + 554, d, ctx, a100.chunk_attn_ms(554, k))
    assert bound == pytest.approx(50.576, abs=1e-3)  # > 50: the budget is fewer tokens
    fewer = [a100.step_ms(d2 + n, d2, c, a100.chunk_attn_ms(n, k) if n else 0.0)
             for n in range(555) for d2, c in ((d, ctx), (d - 1, ctx - 700), (0, 0))]
    assert max(fewer) <= bound


def test_a_steps_floor_bounds_every_step_of_at_least_its_tokens():
    """The searches for the most tokens (or the largest batch) that fit a time bisect on a
    monotone envelope: linear_floor(T) is the least any T' ≥ T costs (the A100's 544 tokens
    cost 41.52 ms, but 560 cost 39.02), and step_ms_at_least is never above step_ms of any
    step of at least those tokens, decodes, context and attention, to the bit."""
    a100 = PROFILES["a100-llama3-8b"]
    assert a100.linear_floor(544) == a100.linear(560) < a100.linear(544)
    assert (a100.linear(544), a100.linear(560)) == pytest.approx((41.52, 39.024))
    for p in PROFILES.values():
        n = len(p.linear_ms) + 50
        low = [p.linear(t) for t in range(n)]
        for t in range(n - 2, -1, -1):
            low[t] = min(low[t], low[t + 1])
        assert all(p.linear_floor(t) == low[t] for t in range(n - 50))  # the last 50: beyond the table, rising
        assert all(p.linear_floor(t) == p.linear(t) for t in range(n - 50, n))
    d, ctx, k = 22, 16438, 1675
    floor = a100.step_ms_at_least(d + 521, d, ctx, a100.chunk_attn_ms(521, k))
    more = [a100.step_ms(d + n, d2, c, a100.chunk_attn_ms(n, k)) for n in range(521, 2048) for d2, c in ((d, ctx), (d + 1, ctx + 700))]
    assert floor <= min(more) and floor < more[0]  # below the step of exactly 521: linear dips at 560
