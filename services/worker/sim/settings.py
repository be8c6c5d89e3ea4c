"""The simulated engine built from the worker's command line, which names vLLM's settings
(`--kv-cache-dtype`, `--quantization`, `--kv-offload-gb`, `--preemption-mode`,
`--max-num-seqs`, `--max-num-batched-tokens`, `--long-prefill-token-threshold`, `--num-blocks`),
so the same flags configure either engine:

    kv-cache-dtype  auto | fp16 | bf16 | fp8, fp8_e4m3, fp8_e5m2 (→ fp8: half the bytes per token)
    quantization    none | fp8, fp8_per_block, fp8_per_channel (→ fp8: data/profiles.json's factor)
    kv-offload-gb   the host KV tier: gb × 10⁹ / (bytes per token × block size) blocks
and the simulated engine's own scheduling policy (`--scheduling`, engine_policies.py: vllm,
scorpio, priority-kv, scorpio+kv).
"""

from __future__ import annotations

import dataclasses

from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine_policies import make_engine_policy
from tokenyard.services.worker.sim.latency import LatencyProfile


def kv_dtype(name: str | None) -> str:
    name = (name or "auto").lower()
    return "fp8" if name.startswith("fp8") else name


def quantization(name: str | None) -> str:
    name = (name or "none").lower()
    return "fp8" if name.startswith("fp8") else name


def host_blocks(prof: LatencyProfile, block_size: int, gb: float) -> int:
    return int(gb * 1e9 // (prof.kv_bytes_per_token * block_size))


def sim_core(prof: LatencyProfile, block_size: int, args) -> SimEngineCore:
    """`args`: the worker's parsed arguments (missing ones take their defaults)."""
    prof = prof.with_settings(kv_cache_dtype=kv_dtype(getattr(args, "kv_cache_dtype", None)),
                              quantization=quantization(getattr(args, "quantization", None)))
    limits = {k: v for k in ("max_num_seqs", "max_num_batched_tokens") if (v := getattr(args, k, None))}
    threshold = getattr(args, "long_prefill_token_threshold", None)
    if threshold is not None:  # 0 means no cap, so not `if threshold` (SimEngineCore refuses < 0)
        limits["long_prefill_token_threshold"] = threshold
    if limits:
        prof = dataclasses.replace(prof, **limits)
    return SimEngineCore(
        prof, block_size, getattr(args, "num_blocks", None),
        host_blocks=host_blocks(prof, block_size, getattr(args, "kv_offload_gb", 0.0) or 0.0),
        preemption_mode=getattr(args, "preemption_mode", None) or "recompute",
        policy=make_engine_policy(getattr(args, "scheduling", None) or "vllm", prof),
    )
