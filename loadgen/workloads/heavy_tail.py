"""Seed 004's heavy-tailed length mix as a block-id workload (no shared prefixes: the test is
about lengths, not caching).

    bucket      [16, 512)  [512, 2k)  [2k, 8k)  [8k, 32k)     prompt tokens, log-uniform within
    share         45%        30%        15%        10%       (`shares`: another mix)
    max_tokens ~ round(LogNormal(ln 128, 0.6)) ∈ [8, 1024]
Arrivals Poisson at `rate` (DEFAULT_RATE when None) × rate_scale ÷ time_scale; priorities from
`priority_mix`; arrivals at or after `duration_s` dropped. A seed fixes everything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from tokenyard.loadgen.workloads.blocks import TraceRequest

BUCKETS: tuple[tuple[int, int], ...] = ((16, 512), (512, 2048), (2048, 8192), (8192, 32768))
SHARES: tuple[float, ...] = (0.45, 0.30, 0.15, 0.10)


class HeavyTailWorkload:
    name = "heavy-tail"
    block_tokens = 16
    DEFAULT_RATE = 4.0

    def __init__(self, num_requests: int = 1000, *, rate: float | None = None, burstiness: float = 1.0,
                 rate_scale: float = 1.0, time_scale: float = 1.0, priority_mix: Sequence[float] = (0, 1, 0, 0),
                 seed: int = 0, duration_s: float | None = None, shares: Sequence[float] = SHARES):
        if num_requests < 0:
            raise ValueError("num_requests must be >= 0")
        if burstiness != 1.0:
            raise ValueError("the heavy-tail workload's arrivals are Poisson (burstiness 1)")
        if not rate_scale > 0 or not time_scale > 0:
            raise ValueError("rate_scale and time_scale must be positive")
        self.rate = (self.DEFAULT_RATE if rate is None else rate) * rate_scale / time_scale
        if not self.rate > 0:
            raise ValueError("rate must be positive")
        self.num_requests, self.seed, self.duration_s = num_requests, seed, duration_s
        self.priority_mix = np.asarray(priority_mix, dtype=float) / float(sum(priority_mix))
        if len(shares) != len(BUCKETS) or min(shares) < 0 or not sum(shares) > 0:
            raise ValueError(f"shares must be {len(BUCKETS)} non-negative numbers, not all 0")
        self.shares = np.asarray(shares, dtype=float) / float(sum(shares))
        self._cache: list[TraceRequest] | None = None

    def items(self) -> list[TraceRequest]:
        if self._cache is None:
            n = self.num_requests
            rng = np.random.default_rng(self.seed)
            gaps = rng.exponential(1.0 / self.rate, size=n)
            arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
            bucket = rng.choice(len(BUCKETS), size=n, p=self.shares)
            lo = np.array([BUCKETS[b][0] for b in bucket], dtype=float)
            hi = np.array([BUCKETS[b][1] for b in bucket], dtype=float)
            prompt = np.floor(np.exp(rng.uniform(np.log(lo), np.log(hi)))).astype(np.int64)
            out = np.clip(np.rint(rng.lognormal(math.log(128), 0.6, size=n)), 8, 1024).astype(np.int64)
            prio = rng.choice(4, size=n, p=self.priority_mix)
            # every request its own blocks: ids from one counter (no prefix is shared)
            nblocks = -(-prompt // self.block_tokens)
            first = np.concatenate([[0], np.cumsum(nblocks)[:-1]])
            self._cache = [
                TraceRequest(i, float(arrivals[i]), int(prompt[i]), int(out[i]), int(prio[i]),
                             tuple(range(int(first[i]), int(first[i] + nblocks[i]))))
                for i in range(n)
                if self.duration_s is None or arrivals[i] < self.duration_s
            ]
        return self._cache
