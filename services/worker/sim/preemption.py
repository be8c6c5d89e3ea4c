"""How a preempted request gives its KV blocks back (DESIGN §3.5, seed 001).

    recompute  free its blocks; it re-prefills prompt + generated tokens later (vLLM V1's only mode)
    swap       copy its KV to the host tier (t_swap = KV bytes / host link, paid in the step that
               preempts and again in the step that resumes it); it resumes where it stopped
    auto       swap when t_swap < 0.3 × t_recompute (the prefill time of what it has computed),
               else recompute

Swap needs room in the host tier; without it a swap falls back to recompute.
"""

from __future__ import annotations

import enum

from tokenyard.services.worker.sim.latency import LatencyProfile

AUTO_SWAP_RATIO = 0.3
"""Seed 001: swap when its transfer takes less than 0.3 × the recompute."""


class PreemptionMode(enum.StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"
    AUTO = "auto"


def wants_swap(mode: PreemptionMode, prof: LatencyProfile, kv_tokens: int) -> bool:
    if mode is PreemptionMode.RECOMPUTE or kv_tokens == 0:
        return False
    if mode is PreemptionMode.SWAP:
        return True
    return prof.transfer_s(kv_tokens) < AUTO_SWAP_RATIO * prof.prefill_s(kv_tokens)
