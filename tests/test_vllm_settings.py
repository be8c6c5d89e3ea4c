"""Worker settings → vLLM engine arguments (services/worker/vllm/settings.py), and the
stats tracker (services/worker/vllm/stats.py). Pure: no vLLM needed."""

from __future__ import annotations

import pytest
from tokenyard.services.worker.vllm.settings import SettingsError, VllmSettings, engine_kwargs, vllm_priority
from tokenyard.services.worker.vllm.stats import StatsTracker

EP = "ipc:///tmp/x/kv"


def test_defaults_turn_on_what_the_fleet_needs():
    kw = engine_kwargs(VllmSettings(model="/m"), "cuda", EP)
    assert kw["enable_prefix_caching"] is True
    assert kw["scheduling_policy"] == "priority"
    assert kw["kv_events_config"] == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": EP, "topic": ""}
    assert "kv_offloading_size" not in kw and "block_size" not in kw and "scheduler_cls" not in kw


def test_settings_map_onto_vllm_names():
    s = VllmSettings(
        model="/m", served_model_name="llama", kv_cache_dtype="fp16", quantization="fp8_per_block",
        max_num_seqs=8, max_num_batched_tokens=512, block_size=32, enforce_eager=True,
        kv_cache_memory_gb=0.5, scheduler_cls="pkg.mod.Scorpio", dtype="float16", stream_interval=4,
    )
    kw = engine_kwargs(s, "cpu", EP)
    assert s.name == "llama"
    assert (kw["kv_cache_dtype"], kw["quantization"], kw["dtype"]) == ("float16", "fp8_per_block", "float16")
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"], kw["block_size"]) == (8, 512, 32)
    assert kw["kv_cache_memory_bytes"] == 1 << 29
    assert kw["scheduler_cls"] == "pkg.mod.Scorpio" and kw["enforce_eager"] is True
    assert kw["stream_interval"] == 4


def test_kv_offload_goes_to_the_offloading_connector_on_gpus_and_is_refused_on_cpu():
    kw = engine_kwargs(VllmSettings(model="/m", kv_offload_gb=8), "cuda", EP)
    assert kw["kv_offloading_size"] == 8
    assert kw["kv_transfer_config"]["kv_connector_extra_config"]["self_describing_kv_events"] is True
    with pytest.raises(SettingsError, match="not available on platform 'cpu'.*CUDA/ROCm and XPU"):
        engine_kwargs(VllmSettings(model="/m", kv_offload_gb=8), "cpu", EP)


def test_swap_preemption_means_offload():
    with pytest.raises(SettingsError, match="needs --kv-offload-gb"):
        engine_kwargs(VllmSettings(model="/m", preemption_mode="swap"), "cuda", EP)
    kw = engine_kwargs(VllmSettings(model="/m", preemption_mode="swap", kv_offload_gb=4), "cuda", EP)
    assert kw["kv_offloading_size"] == 4
    with pytest.raises(SettingsError, match="choose one of"):
        engine_kwargs(VllmSettings(model="/m", preemption_mode="evict"), "cuda", EP)


def test_what_cpu_cannot_run_is_refused_by_name():
    with pytest.raises(SettingsError, match="'mxfp8' does not run on platform 'cpu'"):
        engine_kwargs(VllmSettings(model="/m", quantization="mxfp8"), "cpu", EP)
    with pytest.raises(SettingsError, match="multiple of 32"):
        engine_kwargs(VllmSettings(model="/m", block_size=16), "cpu", EP)
    assert engine_kwargs(VllmSettings(model="/m", block_size=16, quantization="fp8"), "cuda", EP)["block_size"] == 16


def test_cpu_gets_a_bounded_kv_cache_unless_one_is_set():
    assert engine_kwargs(VllmSettings(model="/m"), "cpu", EP)["kv_cache_memory_bytes"] == 2 << 30
    assert "kv_cache_memory_bytes" not in engine_kwargs(VllmSettings(model="/m"), "cuda", EP)
    kw = engine_kwargs(VllmSettings(model="/m", gpu_memory_utilization=0.5), "cpu", EP)
    assert "kv_cache_memory_bytes" not in kw and kw["gpu_memory_utilization"] == 0.5


def test_priority_classes_keep_their_order():
    assert [vllm_priority(c) for c in (0, 1, 2, 3)] == [0, 1, 2, 3]


def test_stats_count_kv_in_fleet_blocks_and_sum_the_per_step_deltas():
    t = StatsTracker(fleet_block_size=16)
    t.configure(num_blocks=100, block_size=128)  # 100 vLLM blocks of 128 = 800 fleet blocks
    t.on_step(running=3, waiting=2, kv_usage=0.25, prefix_hits=32, prefix_queries=100, now=10.0)
    t.on_step(running=3, waiting=1, kv_usage=0.25, prefix_hits=0, prefix_queries=50, now=10.02)
    t.on_preempted(2)
    s = t.snapshot(open_requests=5, queued_prefill_tokens=300)
    assert (s.running, s.waiting, s.queued_prefill_tokens) == (3, 1, 300)
    assert (s.kv_blocks_used, s.kv_blocks_free, s.block_size) == (200, 600, 16)
    assert (s.prefix_hits, s.prefix_queries, s.preemptions) == (32, 150, 2)
    assert s.step_time_ms == pytest.approx(20.0)


def test_stats_never_exceed_the_requests_actually_open():
    t = StatsTracker(fleet_block_size=16)
    t.configure(num_blocks=10, block_size=32)
    t.on_step(running=4, waiting=2, kv_usage=0.5, prefix_hits=0, prefix_queries=0, now=1.0)
    s = t.snapshot(open_requests=0, queued_prefill_tokens=0)  # the last report trails the aborts
    assert (s.running, s.waiting, s.kv_blocks_used, s.kv_blocks_free) == (0, 0, 0, 20)
    s = t.snapshot(open_requests=5, queued_prefill_tokens=0)
    assert (s.running, s.waiting) == (4, 1)


def test_the_prefill_rate_is_the_time_chunked_steps_take_beyond_a_decode_step_per_computed_token():
    t = StatsTracker(fleet_block_size=16)
    t.configure(num_blocks=100, block_size=16)
    assert t.snapshot(open_requests=0, queued_prefill_tokens=0).prefill_ms_per_token == 0.0  # nothing measured
    # decode-only steps of 10 ms
    t.on_arrival(0.0)
    t.on_step(running=1, waiting=0, kv_usage=0.1, prefix_hits=0, prefix_queries=0, now=0.010)
    t.on_step(running=1, waiting=0, kv_usage=0.1, prefix_hits=0, prefix_queries=0, now=0.020)
    assert t.decode_step_ms == pytest.approx(10.0)
    # a 1000-token prompt arrives: two chunked steps of 60 ms, 50 ms of prefill each; vLLM computed
    # 900 of its tokens (100 came from its prefix cache) → 100 ms / 900 tokens
    t.queued_prefill = 1000
    t.on_step(running=1, waiting=1, kv_usage=0.1, prefix_hits=0, prefix_queries=0, now=0.030)  # still decode
    t.on_step(running=2, waiting=0, kv_usage=0.2, prefix_hits=0, prefix_queries=0, now=0.090)
    t.queued_prefill = 0  # its first token is out
    t.on_step(running=2, waiting=0, kv_usage=0.2, prefix_hits=100, prefix_queries=1000, now=0.150,
              prompt_tokens_computed=900)
    s = t.snapshot(open_requests=2, queued_prefill_tokens=0)
    assert s.prefill_ms_per_token == pytest.approx(100.0 / 900)
    # the next prefill (300 tokens in one 40 ms step: 30 ms) folds in with weight 1, the past decays by 0.8
    t.queued_prefill = 300
    t.on_step(running=2, waiting=1, kv_usage=0.2, prefix_hits=0, prefix_queries=0, now=0.160)  # decode: 10 ms
    t.queued_prefill = 0
    t.on_step(running=3, waiting=0, kv_usage=0.3, prefix_hits=0, prefix_queries=300, now=0.200,
              prompt_tokens_computed=300)
    assert t.prefill_ms_per_token == pytest.approx((0.8 * 100.0 + 30.0) / (0.8 * 900 + 300))


def test_an_engine_that_went_idle_times_its_next_request_from_its_arrival():
    t = StatsTracker(fleet_block_size=16)
    t.queued_prefill = 500
    t.on_arrival(5.0)
    t.queued_prefill = 0
    # the 500-token prompt in one 50 ms step, no decode step measured yet (decode time 0)
    t.on_step(running=1, waiting=0, kv_usage=0.1, prefix_hits=0, prefix_queries=500, now=5.05,
              prompt_tokens_computed=500)
    assert t.prefill_ms_per_token == pytest.approx(0.1)
    t.on_step(running=0, waiting=0, kv_usage=0.0, prefix_hits=0, prefix_queries=0, now=5.06)
    t.on_arrival(9.0)  # idle in between: not a step
    t.on_step(running=1, waiting=0, kv_usage=0.1, prefix_hits=0, prefix_queries=0, now=9.01)
    assert t.step_time_ms == pytest.approx(0.2 * 10 + 0.8 * (0.2 * 10 + 0.8 * 50))  # not the idle 4 s
