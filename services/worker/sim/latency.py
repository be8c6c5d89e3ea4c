"""Step time of the simulated engine, from the closed form fitted on published
measurements (../shared/calibration/README.md, "Closed form", Llama-3-8B, TP 1):

    decode part  = d + e·B + f·Σctx                  (B decoding sequences, Σctx their context)
    prefill part = Σ_chunks  b·N + c_self·N²/2 + c_ctx·N·K   (+ a once if any chunk)
    step         = overhead + decode part (if B > 0) + prefill part

N = new tokens of a chunk, K = tokens already cached/computed before it. `overhead` is the
≈1–1.5 ms per step the README finds unexplained against vLLM's CI runs. Issue 3 replaces
this with the Vidur-table interpolation; the interface (step_s) stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyProfile:
    name: str
    d_ms: float
    e_us_per_seq: float
    f_ns_per_ctx: float
    a_ms: float
    b_us_per_token: float
    c_self_ns: float
    c_ctx_ns: float
    overhead_ms: float
    num_gpu_blocks: int
    """KV blocks of 16 tokens: (GPU memory × 0.9 − weights) / 128 KiB per token / 16."""
    max_num_batched_tokens: int
    max_num_seqs: int

    def step_s(self, decode_batch: int, decode_ctx: int, chunks: Sequence[tuple[int, int]]) -> float:
        if decode_batch == 0 and not chunks:
            return 0.0
        ms = self.overhead_ms
        if decode_batch:
            ms += self.d_ms + self.e_us_per_seq * 1e-3 * decode_batch + self.f_ns_per_ctx * 1e-6 * decode_ctx
        if chunks:
            ms += self.a_ms
            for n, k in chunks:
                ms += self.b_us_per_token * 1e-3 * n + self.c_self_ns * 1e-6 * n * n / 2 + self.c_ctx_ns * 1e-6 * n * k
        return ms / 1000.0


# Coefficients: ../shared/calibration/README.md, table "Closed form"; overhead 1.2 ms from
# its note on vLLM CI runs; block counts: A100-80GB (72 GB − 16 GB weights) / 128 KiB / 16,
# H100-80GB the same, H200 (127 GB − 16 GB); batching limits: vLLM V1 defaults in the README.
PROFILES: dict[str, LatencyProfile] = {
    "a100-llama3-8b": LatencyProfile("a100-llama3-8b", 10.47, 34.9, 76.6, 6.04, 65.7, 2.96, 4.67, 1.2, 27_343, 2048, 256),
    "h100-llama3-8b": LatencyProfile("h100-llama3-8b", 6.34, 21.1, 46.6, 1.88, 20.5, 1.48, 2.34, 1.2, 27_343, 8192, 1024),
    "h200-llama3-8b": LatencyProfile("h200-llama3-8b", 4.43, 14.8, 32.5, 1.88, 20.5, 1.48, 2.34, 1.2, 54_199, 8192, 1024),
    # No latency at all: measures the control plane alone.
    "zero": LatencyProfile("zero", 0, 0, 0, 0, 0, 0, 0, 0, 1_000_000, 1 << 20, 1 << 16),
}


def profile(name: str) -> LatencyProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile '{name}'; known: {', '.join(PROFILES)}") from None
