"""Step time of the simulated engine, from published measurements (data/profiles.json names the
source of every number; data/vidur.json holds the measured tables, see calibrate.py):

    step(ms) = overhead
             + linear(T)                                   T = all tokens scheduled this step
             + Σ_prefill chunks  p0 + p1·N + p2·N²/2 + p3·N·K    N new tokens on K cached ones
             + [B > 0] (d0 + d2·Σctx)                      B decoding sequences, Σctx their context

* linear(T): layers × Vidur's per-layer time of the linear ops (projections, MLP, norms) at T
  tokens, linearly interpolated between its rows (A100, measured); on H100 divided by Vidur's
  A100:H100 ratio for Llama-2-7B at T; on H200 the memory-bound region (T ≤ 128) further × 3.35/4.8.
  For a mixture of experts (Qwen3-30B-A3B) a roofline instead:
      linear(T) = max((dense + E(T)·layers·expert bytes) / (HBM·η_mem), 2·T·active / (FLOPs·η_flop)),
      E(T) = experts·(1 − (1 − k/experts)^T)   distinct experts a step touches.
  Another dense model or GPU (the seed's CodeLlama-34B on L20s): the A100 Llama-3-8B rows × the
  per-GPU weight ratio × the GPU ratio (HBM bandwidth where memory-bound, FLOPs where compute-
  bound); at tensor parallelism n, plus the all-reduces: 2·layers·(α + T·hidden·2 B / algbw).
* attention: Vidur's A100 Llama-3-8B attention rows fitted to the forms above (×32 layers), scaled
  per profile (H100 prefill ×0.5 — compute —, decode ×0.6035 — memory —, …).
* settings: weight quantization multiplies linear(T) by its documented factor (fp8: 1/1.6); the
  KV cache dtype scales decode attention and bytes per token (fp8: ×0.5).
A step with nothing scheduled takes no time. `step_s(B, Σctx, [(N, K), …])` is the interface.
The measured linear(T) is not monotone (a kernel's tiles): `step_ms_at_most` prices linear at
its most for any T' ≤ T, a bound on every step of at most T tokens (SCORPIO's token budget);
`step_ms_at_least` at its least for any T' ≥ T, the monotone envelope its searches bisect on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import numpy as np
from tokenyard.services.worker.engine import DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD

DATA = Path(__file__).with_name("data")
_ATTN_LAYERS = 32
"""The attention fit is per layer of Llama-3-8B; profile scales are relative to its 32 layers."""


def _v(x):
    return x["value"] if isinstance(x, dict) else x


@dataclass(frozen=True)
class MoE:
    num_experts: int
    experts_per_token: int
    layers: int
    expert_bytes_per_layer: float
    dense_bytes: float
    active_params: float
    hbm_bytes_per_ms: float
    flops_per_ms: float
    memory_efficiency: float
    compute_efficiency: float

    def linear_ms(self, tokens: int) -> float:
        e = self.num_experts * (1.0 - (1.0 - self.experts_per_token / self.num_experts) ** tokens)
        mem = (self.dense_bytes + e * self.layers * self.expert_bytes_per_layer) / (
            self.hbm_bytes_per_ms * self.memory_efficiency
        )
        flop = 2.0 * tokens * self.active_params / (self.flops_per_ms * self.compute_efficiency)
        return mem if mem > flop else flop


@dataclass(frozen=True)
class LatencyProfile:
    name: str
    linear_ms: tuple[float, ...]
    """linear(T) for T = 0 … len − 1 tokens (all layers, ms); beyond, the last slope."""
    p0: float
    p1: float
    p2: float
    p3: float
    """Prefill attention of one chunk (ms, all layers): p0 + p1·N + p2·N²/2 + p3·N·K."""
    d0: float
    d2: float
    """Decode attention of a step (ms): d0 + d2·Σctx."""
    overhead_ms: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    """KV tokens that fit on the GPU: (memory × utilisation − weights) / bytes per token."""
    max_num_batched_tokens: int
    max_num_seqs: int
    host_link_bytes_per_s: float = 25e9
    """GPU↔host transfer rate, for swap and the host KV tier."""
    moe: MoE | None = None
    linear_factor: float = 1.0
    """Weight quantization speed factor on linear(T)."""
    tp: int = 1
    """GPUs per instance (tensor parallelism); linear(T) includes their all-reduces."""
    network_bytes_per_s: float = 12.5e9
    """Instance↔instance link (another node): spatial P/D moves a prompt's KV over it."""
    long_prefill_token_threshold: int = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    """vLLM's setting of that name: the most prompt tokens one request prefills in a step
    while others are in the engine (0: no cap, the default; services/worker/engine.py says why)."""

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks of 16 tokens (the default block size)."""
        return self.kv_capacity_tokens // 16

    def blocks(self, block_size: int) -> int:
        return self.kv_capacity_tokens // block_size

    def linear(self, tokens: int) -> float:
        if self.moe is not None:
            return self.moe.linear_ms(tokens) * self.linear_factor if tokens else 0.0
        table = self.linear_ms
        if tokens < len(table):
            return table[tokens]
        last = len(table) - 1
        return table[last] + (table[last] - table[last - 1]) * (tokens - last)

    def linear_ceiling(self, tokens: int) -> float:
        """The most linear(t) costs for any t ≤ `tokens`. The measured rows are not monotone
        (a kernel's tiles: on a100-llama3-8b 543 tokens take 41.4 ms, 576 take 40.0), so a step
        priced at T tokens that runs fewer — a prompt's last chunk short of the budget — can cost
        more: a bound on every step of at most T tokens prices this. A mixture of experts'
        roofline is monotone already."""
        if self.moe is not None:
            return self.linear(tokens)
        top = self._linear_ceiling_ms
        if tokens < len(top):
            return top[tokens]
        return max(top[-1], self.linear(tokens))

    @cached_property
    def _linear_ceiling_ms(self) -> tuple[float, ...]:
        return tuple(np.maximum.accumulate(np.asarray(self.linear_ms)).tolist())

    def linear_floor(self, tokens: int) -> float:
        """The least linear(t) costs for any t ≥ `tokens`: monotone, so a search for the most
        tokens that fit a time can bisect on it and then walk down to the count that really fits
        (SCORPIO's `largest_within`). Beyond the table the last slope, which rises."""
        if self.moe is not None:
            return self.linear(tokens)
        low = self._linear_floor_ms
        if tokens < len(low):
            return low[tokens]
        return self.linear(tokens)

    @cached_property
    def _linear_floor_ms(self) -> tuple[float, ...]:
        table = np.asarray(self.linear_ms)
        assert table[-1] >= table[-2], f"{self.name}: linear(T) falls beyond its table"
        return tuple(np.minimum.accumulate(table[::-1])[::-1].tolist())

    def step_ms(self, tokens: int, decode_batch: int, decode_ctx: int, prefill_attn_ms: float) -> float:
        """The step's time given its token count and the prefill attention already summed
        (the engine core's hot path: no per-chunk call). SimEngineCore.advance repeats this
        formula for decode-only steps, hoisted: change both (tests/test_sim_advance.py checks
        they agree to the bit)."""
        if tokens == 0:
            return 0.0
        ms = self.overhead_ms + self.linear(tokens) + prefill_attn_ms
        if decode_batch:
            ms += self.d0 + self.d2 * decode_ctx
        return ms

    def step_ms_at_most(self, tokens: int, decode_batch: int, decode_ctx: int, prefill_attn_ms: float) -> float:
        """The most a step of at most `tokens` tokens costs, with at most these decodes, their
        context and this prefill attention: `step_ms` with linear at its ceiling (same order of
        operations, so never below `step_ms` of any such step, to the bit)."""
        return self._priced(self.linear_ceiling(tokens), decode_batch, decode_ctx, prefill_attn_ms) if tokens else 0.0

    def step_ms_at_least(self, tokens: int, decode_batch: int, decode_ctx: int, prefill_attn_ms: float) -> float:
        """The least a step of at least `tokens` tokens costs, with at least these decodes, their
        context and this prefill attention: `step_ms` with linear at its floor (never above
        `step_ms` of any such step, to the bit)."""
        return self._priced(self.linear_floor(tokens), decode_batch, decode_ctx, prefill_attn_ms) if tokens else 0.0

    def _priced(self, linear_ms: float, decode_batch: int, decode_ctx: int, prefill_attn_ms: float) -> float:
        """`step_ms`'s formula, in its order of operations, with this linear term."""
        ms = self.overhead_ms + linear_ms + prefill_attn_ms
        if decode_batch:
            ms += self.d0 + self.d2 * decode_ctx
        return ms

    def chunk_attn_ms(self, n: int, k: int) -> float:
        return self.p0 + n * (self.p1 + self.p2 * n * 0.5 + self.p3 * k)

    def step_s(self, decode_batch: int, decode_ctx: int, chunks: Sequence[tuple[int, int]]) -> float:
        tokens = decode_batch + sum(n for n, _ in chunks)
        attn = sum(self.chunk_attn_ms(n, k) for n, k in chunks)
        return self.step_ms(tokens, decode_batch, decode_ctx, attn) / 1000.0

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        """One prompt alone, in chunks of max_num_batched_tokens: the recompute cost of a
        preemption."""
        total, done = 0.0, cached
        while done < cached + tokens:
            n = min(self.max_num_batched_tokens, cached + tokens - done)
            total += self.step_s(0, 0, [(n, done)])
            done += n
        return total

    def at_speed(self, speed: float) -> LatencyProfile:
        """The same GPU `speed` times as fast (0.1: ten times slower): every time cost ÷ speed,
        every transfer rate × speed. A worker run at `--speed` steps on this profile in wall
        time, so what it reports (prefill cost per token, step time, its decodes' TPOT slack)
        is what its clients see: the control plane's wall-clock targets judge it as it is."""
        if speed == 1.0:
            return self
        k = 1.0 / speed
        return dataclasses.replace(
            self,
            linear_ms=self.linear_ms if self.moe is not None else tuple(x * k for x in self.linear_ms),
            linear_factor=self.linear_factor * k if self.moe is not None else self.linear_factor,
            p0=self.p0 * k, p1=self.p1 * k, p2=self.p2 * k, p3=self.p3 * k, d0=self.d0 * k, d2=self.d2 * k,
            overhead_ms=self.overhead_ms * k,
            host_link_bytes_per_s=self.host_link_bytes_per_s * speed,
            network_bytes_per_s=self.network_bytes_per_s * speed,
        )

    def transfer_s(self, kv_tokens: int) -> float:
        """Moving kv_tokens of KV between GPU and host memory."""
        return kv_tokens * self.kv_bytes_per_token / self.host_link_bytes_per_s

    def network_s(self, kv_tokens: int) -> float:
        """Moving kv_tokens of KV to another instance (spatial P/D's hand-off)."""
        return kv_tokens * self.kv_bytes_per_token / self.network_bytes_per_s

    def with_settings(self, kv_cache_dtype: str = "auto", quantization: str = "none") -> LatencyProfile:
        """The profile with a KV cache dtype and a weight quantization (data/profiles.json)."""
        return _with_settings(self, kv_cache_dtype, quantization)


# ───────────────────────────── building profiles from the data files ─────────────────────────────


def _load() -> tuple[dict, dict]:
    return json.loads((DATA / "profiles.json").read_text()), json.loads((DATA / "vidur.json").read_text())


def _linear_table(spec: dict, vidur: dict, layers: int, allreduce=None) -> tuple[float, ...]:
    tables = vidur["linear_per_layer_ms"]
    base = tables[spec["table"]]
    top = base["tokens"][-1]
    n = np.arange(top + 1, dtype=float)
    ms = np.interp(n, base["tokens"], base["ms_per_layer"])
    if "ratio" in spec:
        num, den = (tables[k] for k in spec["ratio"])
        ms = ms * np.interp(n, num["tokens"], num["ms_per_layer"]) / np.interp(n, den["tokens"], den["ms_per_layer"])
    if "memory_bound_scale" in spec:
        lo, hi, s = spec["memory_bound_until"], spec["compute_bound_from"], spec["memory_bound_scale"]
        ms = ms * np.interp(n, [lo, hi], [s, 1.0])
    if "per_layer_factor" in spec:  # another model's layer, priced by its weights per GPU
        ms = ms * spec["per_layer_factor"]
    if "gpu_scale" in spec:  # another GPU: bandwidth ratio where memory-bound, FLOPs ratio where compute-bound
        g = spec["gpu_scale"]
        ms = ms * np.interp(n, [g["memory_bound_until"], g["compute_bound_from"]], [g["memory_bound"], g["compute_bound"]])
    ms = ms * layers
    if allreduce is not None:
        ms = ms + allreduce(n)
    ms[0] = 0.0
    return tuple(ms.tolist())


def _allreduce(data: dict, spec: dict, model: dict, layers: int):
    """Tensor parallelism's all-reduces of a step of T tokens (ms), NCCL ring, 2 per layer:
        2 · layers · (latency + T · hidden · 2 bytes / algbw),  algbw = busbw · n / (2(n − 1))
    None at TP 1."""
    tp = spec.get("tp", 1)
    if tp == 1:
        return None
    link = data["interconnects"][spec["interconnect"]]
    if link["gpus"] != tp:
        raise ValueError(f"interconnect {spec['interconnect']} is measured on {link['gpus']} GPUs, not {tp}")
    algbw = _v(link["allreduce_bus_gbps"]) * 1e9 * tp / (2 * (tp - 1))  # bytes/s
    lat_ms = _v(link["allreduce_latency_us"]) / 1000.0
    bytes_per_token = _v(model["hidden"]) * 2
    return lambda n: 2 * layers * (lat_ms + n * bytes_per_token / algbw * 1000.0)


def _build(name: str, data: dict, vidur: dict, moe_fit: dict | None = None) -> LatencyProfile:
    spec = data["profiles"][name]
    gpu = data["gpus"][spec["gpu"]]
    model = data["models"][spec["model"]]
    layers = _v(model["layers"])
    attn = vidur["attention_a100_llama3_8b"]
    pre, dec = attn["prefill_per_layer_ms"], attn["decode_per_layer_ms"]
    ps, ds = spec["attention"]["prefill_scale"] * _ATTN_LAYERS, spec["attention"]["decode_scale"] * _ATTN_LAYERS
    tp = spec.get("tp", 1)
    mem = tp * _v(gpu["memory_bytes"]) * _v(data["gpu_memory_utilization"]) - _v(model["weight_bytes"])
    kv_bytes = _v(model["kv_bytes_per_token"])
    moe = None
    table: tuple[float, ...] = (0.0, 0.0)
    if "moe" in spec:
        fit = moe_fit or spec["moe"]
        moe = MoE(
            num_experts=_v(model["num_experts"]),
            experts_per_token=_v(model["experts_per_token"]),
            layers=layers,
            expert_bytes_per_layer=_v(model["expert_bytes_per_layer"]),
            dense_bytes=_v(model["dense_bytes"]),
            active_params=_v(model["active_params"]),
            hbm_bytes_per_ms=_v(gpu["hbm_tbps"]) * 1e9,
            flops_per_ms=_v(gpu["dense_bf16_tflops"]) * 1e9,
            memory_efficiency=fit["memory_efficiency"],
            compute_efficiency=fit["compute_efficiency"],
        )
    else:
        table = _linear_table(spec["linear"], vidur, layers, _allreduce(data, spec, model, layers))
    return LatencyProfile(
        name=name,
        linear_ms=table,
        p0=pre["p0"] * ps,
        p1=pre["p1_per_token"] * ps,
        p2=pre["p2_self"] * ps,
        p3=pre["p3_ctx"] * ps,
        d0=dec["d0"] * ds,
        d2=dec["d2_per_ctx_token"] * ds,
        overhead_ms=_v(data["overhead_ms"]),
        kv_bytes_per_token=kv_bytes,
        kv_capacity_tokens=int(mem // kv_bytes),
        max_num_batched_tokens=_v(spec["max_num_batched_tokens"]),
        max_num_seqs=_v(spec["max_num_seqs"]),
        host_link_bytes_per_s=tp * _v(gpu["host_link_gbps"]) * 1e9,  # each GPU moves its KV shard on its own link
        moe=moe,
        tp=tp,
        network_bytes_per_s=_v(data["network"]["inter_node_gbps"]) * 1e9 / 8,
    )


def _zero() -> LatencyProfile:
    """No latency at all: measures the control plane alone."""
    return LatencyProfile(
        "zero", (0.0, 0.0), 0, 0, 0, 0, 0, 0, 0.0, 131072, 16_000_000, 1 << 20, 1 << 16, host_link_bytes_per_s=math.inf
    )


@cache
def _with_settings(p: LatencyProfile, kv_cache_dtype: str, quantization: str) -> LatencyProfile:
    data, _ = _load()
    try:
        kv = data["kv_cache_dtypes"][kv_cache_dtype]
    except KeyError:
        raise ValueError(f"unknown kv cache dtype '{kv_cache_dtype}'; known: {', '.join(data['kv_cache_dtypes'])}") from None
    try:
        q = data["weight_quantization"][quantization]
    except KeyError:
        known = ", ".join(data["weight_quantization"])
        raise ValueError(f"unknown weight quantization '{quantization}'; known: {known}") from None
    if p.name == "zero":
        return p
    spec = data["profiles"][p.name]
    model = data["models"][spec["model"]]
    gpu = data["gpus"][spec["gpu"]]
    kv_bytes = int(_v(model["kv_bytes_per_token"]) * kv["bytes_factor"])
    mem = spec.get("tp", 1) * _v(gpu["memory_bytes"]) * _v(data["gpu_memory_utilization"]) - _v(
        model["weight_bytes"]
    ) * q["weight_bytes_factor"]
    return dataclasses.replace(
        p,
        name=p.name,
        d0=p.d0 * kv["bytes_factor"],
        d2=p.d2 * kv["bytes_factor"],
        kv_bytes_per_token=kv_bytes,
        kv_capacity_tokens=int(mem // kv_bytes),
        linear_factor=p.linear_factor * q["linear_factor"],
        linear_ms=tuple(x * q["linear_factor"] for x in p.linear_ms) if p.moe is None else p.linear_ms,
    )


def _profiles() -> dict[str, LatencyProfile]:
    data, vidur = _load()
    out = {name: _build(name, data, vidur) for name in data["profiles"]}
    out["zero"] = _zero()
    return out


PROFILES: dict[str, LatencyProfile] = _profiles()


def profile(name: str) -> LatencyProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile '{name}'; known: {', '.join(PROFILES)}") from None
