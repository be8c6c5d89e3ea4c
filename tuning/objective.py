"""The tuning objective (seed 004 §3.3), each term normalised by the run with default knobs
so that α, β, γ weigh comparable numbers:

    J = α · thr / thr₀  +  β · long_done  −  γ · short_p50 / short_p50₀

    thr        completed requests per second of the run
    long_done  share of long requests (L = prompt + max_tokens ≥ long_tokens) whose first
               token came within long_ttft_s of arrival (completing in time, not just at all:
               an open-loop simulation finishes everything eventually)
    short_p50  median TTFT of short requests (L < short_tokens)
Higher is better. Defaults α = β = γ = 1 give J₀ = 1 + long_done₀ − 1 = long_done₀ for the
default run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Weights:
    alpha: float = 1.0
    beta: float = 1.0
    gamma: float = 1.0


@dataclass(frozen=True)
class Measures:
    throughput: float
    """Completed requests per second."""
    long_done: float
    """Share of long requests with TTFT ≤ long_ttft_s (1.0 when there are none)."""
    short_p50_ttft_s: float
    """Median TTFT of short requests (0.0 when there are none)."""
    long_p99_ttft_s: float
    completed: int
    failed: int
    long_p50_ttft_s: float = 0.0
    """Median TTFT of the long requests served (seed 004's table gives one latency per length
    class, not a tail: this is the nearest measure to it)."""
    long_mean_ttft_s: float = 0.0
    short_failed: int = 0
    """Short requests refused or expired (no first token)."""
    long_failed: int = 0
    """Long requests refused or expired (no first token)."""


@dataclass(frozen=True)
class Classes:
    short_tokens: int = 512
    long_tokens: int = 8192
    long_ttft_s: float = 60.0


def measure(rows: list[tuple[int, float | None]], duration_s: float, classes: Classes = Classes()) -> Measures:
    """rows = (length, TTFT in s or None if the request failed) per request."""
    done = [(n, t) for n, t in rows if t is not None]
    short = np.array([t for n, t in done if n < classes.short_tokens])
    long_all = [t for n, t in rows if n >= classes.long_tokens]
    long_ok = [t for t in long_all if t is not None]
    in_time = sum(1 for t in long_ok if t <= classes.long_ttft_s)
    return Measures(
        throughput=len(done) / duration_s if duration_s > 0 else 0.0,
        long_done=in_time / len(long_all) if long_all else 1.0,
        short_p50_ttft_s=float(np.median(short)) if len(short) else 0.0,
        long_p99_ttft_s=float(np.percentile(long_ok, 99)) if long_ok else 0.0,
        completed=len(done),
        failed=len(rows) - len(done),
        long_p50_ttft_s=float(np.median(long_ok)) if long_ok else 0.0,
        long_mean_ttft_s=float(np.mean(long_ok)) if long_ok else 0.0,
        short_failed=sum(1 for n, t in rows if t is None and n < classes.short_tokens),
        long_failed=len(long_all) - len(long_ok),
    )


def score(m: Measures, base: Measures, w: Weights = Weights()) -> float:
    thr = m.throughput / base.throughput if base.throughput > 0 else 0.0
    short = m.short_p50_ttft_s / base.short_p50_ttft_s if base.short_p50_ttft_s > 0 else 0.0
    return w.alpha * thr + w.beta * m.long_done - w.gamma * short
