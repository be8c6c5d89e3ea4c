"""Arrival times of a run, as offsets in seconds from its start (vllm bench serve's process).

Gaps between consecutive requests are Gamma(shape k = burstiness, scale θ = 1/(rate·k)),
so the mean gap is k·θ = 1/rate whatever k is; k = 1 is the exponential gap of a Poisson
process, k < 1 is burstier, k > 1 more regular. The first request goes at offset 0 and
request i at the sum of the first i gaps. rate = inf sends everything at offset 0.
Randomness comes only from the Generator passed in, so a seed fixes the schedule.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """n non-decreasing offsets (float64 seconds), the first 0."""
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if not rate > 0 or not burstiness > 0:
        raise ValueError("rate and burstiness must be positive")
    theta = 1.0 / (rate * burstiness)
    gaps = rng.gamma(shape=burstiness, scale=theta, size=n - 1)
    return np.concatenate(([0.0], np.cumsum(gaps)))
