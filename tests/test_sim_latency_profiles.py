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
