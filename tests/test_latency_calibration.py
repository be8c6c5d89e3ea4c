"""The latency profiles against the published measurements they come from
(data/calibration/README.md): the summed per-iteration tables within 5%, the MoE
profile against the serving benchmark it was fitted to, and end-to-end runs it was not
fitted to (vLLM's CI runs of Llama-3.1-8B)."""

from __future__ import annotations

import dataclasses

import pytest
from tokenyard.services.worker.sim import calibrate, closed_loop
from tokenyard.services.worker.sim.latency import PROFILES, MoE

# README, "Summed per-iteration times, Llama-3-8B, tensor parallel 1 (ms)", no KV-save, no overhead.
PREFILL = {  # tokens: A100, H100, H200
    128: (13.7, 7.1, 5.0),
    512: (36.2, 13.2, 13.2),
    1024: (78.7, 25.0, 25.0),
    2048: (155.7, 49.1, 49.1),
    4096: (304.3, 103.8, 103.8),
    8192: (653.9, 230.5, 230.5),
}
DECODE = {  # (batch, context): A100, H100, H200
    (1, 1024): (10.5, 6.3, 4.4),
    (8, 1024): (11.3, 6.8, 4.8),
    (32, 1024): (14.2, 8.6, 6.0),
    (64, 1024): (17.1, 10.3, 7.2),
    (128, 1024): (24.4, 13.6, 9.5),
    (256, 1024): (39.9, 22.4, 18.7),
    (1, 4096): (10.6, 6.4, 4.4),
    (8, 4096): (13.2, 8.0, 5.6),
    (32, 4096): (21.8, 13.2, 9.2),
    (64, 4096): (33.2, 20.1, 14.0),
    (128, 4096): (54.8, 32.1, 22.4),
}
GPUS = ("a100-llama3-8b", "h100-llama3-8b", "h200-llama3-8b")


def bare(name: str):
    """The tables leave out the per-step engine overhead."""
    return dataclasses.replace(PROFILES[name], overhead_ms=0.0)


@pytest.mark.parametrize("gpu", range(3), ids=GPUS)
def test_prefill_table_within_5_percent(gpu):
    p = bare(GPUS[gpu])
    for tokens, published in PREFILL.items():
        got = p.step_s(0, 0, [(tokens, 0)]) * 1000.0
        assert got == pytest.approx(published[gpu], rel=0.05), (tokens, got, published[gpu])


@pytest.mark.parametrize("gpu", range(3), ids=GPUS)
def test_decode_table_within_5_percent(gpu):
    p = bare(GPUS[gpu])
    for (batch, ctx), published in DECODE.items():
        got = p.step_s(batch, batch * ctx, []) * 1000.0
        assert got == pytest.approx(published[gpu], rel=0.05), (batch, ctx, got, published[gpu])


def test_the_data_file_is_the_reduction_of_the_calibration_data():
    assert calibrate.main(["--check"]) == 0


def test_the_moe_profile_reproduces_the_benchmark_it_was_fitted_to():
    p = PROFILES["h100-qwen3-30b-a3b"]
    assert isinstance(p.moe, MoE)
    t = calibrate.MOE_TARGET
    r = closed_loop.run(p, t["concurrency"], t["input_len"], t["output_len"], t["num_prompts"])
    assert r.mean_tpot_ms == pytest.approx(13.18, rel=0.05)
    assert r.mean_ttft_ms == pytest.approx(267.0, rel=0.05)


def test_moe_decode_cost_follows_the_experts_a_batch_touches():
    m = PROFILES["h100-qwen3-30b-a3b"].moe
    # E(1) = 8 experts of 128, E(10) = 128·(1 − (1 − 8/128)^10) ≈ 60.9: more than 5× the bytes
    one, ten = m.linear_ms(1), m.linear_ms(10)
    assert 4.0 < ten / one < 6.0
    # past ~70 tokens every expert is touched: the memory side stops growing
    assert m.linear_ms(200) == pytest.approx(m.linear_ms(150), rel=0.02)


@pytest.mark.parametrize(
    ("name", "published_ms", "rel"),
    [("a100-llama3-8b", 1579, 0.05), ("h100-llama3-8b", 998, 0.05), ("h200-llama3-8b", 834, 0.12)],
)
def test_end_to_end_against_vllm_ci_runs_not_fitted(name, published_ms, rel):
    """README: vLLM CI, Llama-3.1-8B, batch 8, 32 in / 128 out, end to end. The model is
    3% and 1% short on A100 and H100, 11% on H200 (its per-step overhead is the README's 1.2 ms
    for all GPUs; H200 runs leave more unexplained)."""
    r = closed_loop.run(PROFILES[name], 8, 32, 128, 8)
    assert r.duration_s * 1000.0 == pytest.approx(published_ms, rel=rel)


def test_settings_kv_dtype_and_weight_quantization():
    base = PROFILES["h100-llama3-8b"]
    fp8kv = base.with_settings(kv_cache_dtype="fp8")
    assert fp8kv.kv_bytes_per_token == 65536  # README: Llama-3-8B fp8 KV 64 KiB per token
    assert fp8kv.kv_capacity_tokens == 2 * base.kv_capacity_tokens + 1  # floor of twice the bytes
    assert fp8kv.step_s(64, 64 * 4096, []) < base.step_s(64, 64 * 4096, [])  # half the KV read
    assert fp8kv.step_s(0, 0, [(512, 0)]) == base.step_s(0, 0, [(512, 0)])  # prefill unchanged
    fp8w = base.with_settings(quantization="fp8")
    assert fp8w.linear(4096) == pytest.approx(base.linear(4096) * 0.625, rel=1e-12)  # vLLM docs: up to 1.6×
    assert fp8w.kv_capacity_tokens > base.kv_capacity_tokens  # half the weight bytes
    assert base.with_settings() == base
    with pytest.raises(ValueError, match="unknown kv cache dtype 'int3'"):
        base.with_settings(kv_cache_dtype="int3")
    with pytest.raises(ValueError, match="unknown weight quantization 'awq9'"):
        base.with_settings(quantization="awq9")


def test_swap_versus_recompute_costs_match_the_notes():
    """README: Llama-3-8B at 4k context, swap ~11 ms vs recompute ~104 ms on H100, ~21 vs ~304
    on A100 (swap at 50 GB/s on H100; A100 at PCIe Gen4's ~25 GB/s)."""
    h100, a100 = PROFILES["h100-llama3-8b"], PROFILES["a100-llama3-8b"]
    assert h100.transfer_s(4096) * 1000 == pytest.approx(10.7, rel=0.05)
    assert a100.transfer_s(4096) * 1000 == pytest.approx(21.5, rel=0.05)
    assert h100.prefill_s(4096) * 1000 == pytest.approx(104, rel=0.05)
    # A100's budget of 2048 tokens makes it two chunked steps (+7%: overheads, attention to the first chunk)
    assert a100.prefill_s(4096) * 1000 == pytest.approx(304, rel=0.08)
