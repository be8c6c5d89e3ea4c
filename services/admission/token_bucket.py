"""A token bucket priced in LLM tokens (DESIGN §3.2): a request costs prompt + max_tokens.

    level(t) = min(burst, level(t0) + rate × (t − t0))
    affordable(cost, t) ⇔ level(t) ≥ cost;   wait(cost, t) = (cost − level(t)) / rate

Checking is pure (`wait`); only `take` changes the bucket, so a refused request leaves no
trace and two buckets (global, tenant) are committed together or not at all. A bucket
starts full.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float
    """Tokens per second added."""
    burst: float
    """Capacity: the most a quiet client can spend at once."""
    level_at_t0: float = -1.0
    t0: float = float("-inf")

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError(f"a token bucket needs rate > 0 and burst > 0, got {self.rate}, {self.burst}")
        if self.level_at_t0 < 0:
            self.level_at_t0 = self.burst

    def level(self, now: float) -> float:
        if now <= self.t0:
            return self.level_at_t0
        return min(self.burst, self.level_at_t0 + self.rate * (now - self.t0))

    def wait(self, cost: float, now: float) -> float:
        """Seconds until `cost` is affordable (0: now); inf if it exceeds the burst."""
        if cost > self.burst:
            return float("inf")
        return max(0.0, (cost - self.level(now)) / self.rate)

    def take(self, cost: float, now: float) -> None:
        self.level_at_t0 = self.level(now) - cost
        self.t0 = max(now, self.t0)
