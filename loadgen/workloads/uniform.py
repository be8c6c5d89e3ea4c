"""The `synthetic` workload (vLLM's random dataset) as draws shared by its two faces: the text
prompts `tokenyard bench serve` sends (loadgen/workload.py) and the block-id form the
simulator replays (`UniformWorkload`). For request i

    input_len_i  ~ U{⌊L_in·(1−r)⌋ … ⌈L_in·(1+r)⌉}     (at least 1)
    output_len_i ~ U{⌊L_out·(1−r)⌋ … ⌈L_out·(1+r)⌉}   (at least 1)
    priority_i   ~ Categorical(priority_mix)            (P0..P3)
    arrival gaps ~ Gamma(k = burstiness, θ = 1/(rate·k))  (rate inf: all at offset 0)

Input lengths, output lengths, prompts, priorities and arrivals each draw from their own child
of SeedSequence(seed), so both faces of one seed have the same lengths, classes and arrivals,
changing the rate does not change the prompts, and the first k requests of a run of N are the
first k of any longer run. No two prompts share a block: the block form gives every request
ids of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenyard.loadgen.arrivals import arrival_offsets
from tokenyard.loadgen.workloads.blocks import TraceRequest


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive [low, high] of a drawn length (vllm's random dataset), low at least 1."""
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return low, high


@dataclass(frozen=True)
class UniformDraws:
    input_lens: np.ndarray
    output_lens: np.ndarray
    priorities: np.ndarray
    arrivals: np.ndarray
    prompt_rng: np.random.Generator
    """The generator the text face draws its prompt characters from."""


def draw(n: int, input_len: int, output_len: int, range_ratio: float, priority_mix: Sequence[float],
         rate: float, burstiness: float, seed: int) -> UniformDraws:
    if input_len < 1 or output_len < 1:
        raise ValueError("input and output lengths must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("range_ratio must be in [0, 1)")
    mix = np.asarray(priority_mix, dtype=float) / float(sum(priority_mix))
    in_rng, out_rng, prompt_rng, prio_rng, arrival_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    in_lo, in_hi = length_bounds(input_len, range_ratio)
    out_lo, out_hi = length_bounds(output_len, range_ratio)
    return UniformDraws(
        input_lens=in_rng.integers(in_lo, in_hi + 1, size=n),
        output_lens=out_rng.integers(out_lo, out_hi + 1, size=n),
        priorities=prio_rng.choice(4, size=n, p=mix),
        arrivals=arrival_offsets(n, rate, burstiness, arrival_rng),
        prompt_rng=prompt_rng,
    )


class UniformWorkload:
    """`synthetic` as a block-id workload: lengths, classes and arrivals of `draw`, each prompt
    its own blocks. `rate` None is DEFAULT_RATE; × rate_scale ÷ time_scale."""

    name = "synthetic"
    block_tokens = 16
    DEFAULT_RATE = 40.0
    """req/s: a light load for 4 a100-llama3-8b instances at 1024 in / 128 out (mean TTFT 126 ms
    against 80 ms for the prefill alone: `tokenyard sim --workload synthetic --instances 4`)."""

    def __init__(self, num_requests: int, *, input_len: int = 1024, output_len: int = 128, range_ratio: float = 0.0,
                 rate: float | None = None, burstiness: float = 1.0, rate_scale: float = 1.0,
                 time_scale: float = 1.0, priority_mix: Sequence[float] = (0.0, 1.0, 0.0, 0.0), seed: int = 0,
                 duration_s: float | None = None):
        if num_requests < 0:
            raise ValueError("num_requests must be >= 0")
        if not rate_scale > 0 or not time_scale > 0:
            raise ValueError("rate_scale and time_scale must be positive")
        self.rate = (self.DEFAULT_RATE if rate is None else rate) * rate_scale / time_scale
        if not self.rate > 0:
            raise ValueError("rate must be positive")
        self.args = (num_requests, input_len, output_len, range_ratio, tuple(priority_mix), self.rate, burstiness, seed)
        self.duration_s = duration_s
        draw(0, *self.args[1:])  # bad lengths or rate fail here, not at the first items()
        self._cache: list[TraceRequest] | None = None

    def items(self) -> list[TraceRequest]:
        if self._cache is None:
            d = draw(*self.args)
            nblocks = -(-d.input_lens // self.block_tokens)
            first = np.concatenate([[0], np.cumsum(nblocks)[:-1]]).astype(np.int64)
            self._cache = [
                TraceRequest(i, float(d.arrivals[i]), int(d.input_lens[i]), int(d.output_lens[i]),
                             int(d.priorities[i]), tuple(range(int(first[i]), int(first[i] + nblocks[i]))))
                for i in range(len(d.input_lens))
                if self.duration_s is None or d.arrivals[i] < self.duration_s
            ]
        return self._cache
