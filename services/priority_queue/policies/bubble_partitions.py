"""Seed 004's fixed-partition baseline: the *instances* split by request length.

Each length range [b_k, b_k+1) of the bubble queues' base bounds (BASE_BOUNDS: [0,512) [512,2k)
[2k,8k) [8k,∞), on L = prompt + max_tokens, the length the queue partitions on) gets instances
of its own, and a request goes only to its range's instances; nothing is lent between ranges
(that is the baseline's cost: seed 004 §5.1, 15 vs 17 req/s). Unlike `fixed` (registry.py), a
work-conserving round robin over length partitions of one queue in front of the whole fleet,
here an idle long-request instance cannot serve a short request.

The split is static and chosen with the workload in hand, which favours the baseline:
instances in proportion to each range's work W_k = Σ work(r) over its requests (largest
remainder), every range that has requests at least one instance, an empty range none:

    n_k = 1 + ⌊(N − K) · W_k / W⌋ (+1 for the largest remainders, until Σ n_k = N)
    K   = ranges with requests;  work(r) = the caller's measure of r's engine time (the
          simulator benches use its prefill time on the instances' latency profile: prefill
          grows faster than L and dominates a long request; decodes are batched)

Range k owns the instance indices [Σ_{j<k} n_j, Σ_{j≤k} n_j).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenyard.services.priority_queue.policies.bubble import BASE_BOUNDS


def range_of(length: float, bounds: Sequence[float] = BASE_BOUNDS) -> int:
    """The index of the range [bounds[k], bounds[k+1]) that holds `length` (lengths past the
    last bound belong to the last range)."""
    if length < bounds[0]:
        raise ValueError(f"length {length} is below the first bound {bounds[0]}")
    return min(bisect.bisect_right(bounds, length) - 1, len(bounds) - 2)


def split_instances(work: Sequence[float], instances: int) -> list[int]:
    """Instances per range in proportion to `work` (largest remainder), ≥ 1 for every range
    with work, 0 for one without."""
    if any(w < 0 for w in work):
        raise ValueError("work must be non-negative")
    busy = [k for k, w in enumerate(work) if w > 0]
    if not busy:
        raise ValueError("no range has any work")
    if instances < len(busy):
        raise ValueError(f"{len(busy)} ranges have requests; {instances} instances cannot give each one")
    total = float(sum(work))
    counts = [0] * len(work)
    for k in busy:  # every busy range its one instance first, the rest by share
        counts[k] = 1
    spare = instances - len(busy)
    quota = {k: spare * work[k] / total for k in busy}
    for k in busy:
        counts[k] += int(quota[k])
    left = instances - sum(counts)
    # ties → the longer range (its requests suffer most from a short fleet), deterministically
    order = sorted(busy, key=lambda k: (-(quota[k] - int(quota[k])), -k))
    for k in order[:left]:
        counts[k] += 1
    assert sum(counts) == instances
    return counts


@dataclass(frozen=True)
class FixedPartitions:
    """A static split of N instances over the length ranges of `bounds`."""

    counts: tuple[int, ...]
    """Instances per range (Σ = N)."""
    bounds: tuple[float, ...] = BASE_BOUNDS

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) - 1:
            raise ValueError(f"{len(self.bounds) - 1} ranges need as many counts, got {len(self.counts)}")
        if min(self.counts) < 0:
            raise ValueError("instance counts must be non-negative")

    @classmethod
    def for_requests(cls, requests: Iterable[tuple[float, float]], instances: int,
                     bounds: Sequence[float] = BASE_BOUNDS) -> FixedPartitions:
        """The split of `instances` in proportion to each range's work; `requests` = (L, work)
        per request."""
        work = [0.0] * (len(bounds) - 1)
        for length, w in requests:
            work[range_of(length, bounds)] += w
        return cls(tuple(split_instances(work, instances)), tuple(bounds))

    @property
    def instances(self) -> int:
        return sum(self.counts)

    def range_of(self, length: float) -> int:
        return range_of(length, self.bounds)

    def instances_of(self, k: int) -> range:
        """The instance indices range k owns."""
        first = sum(self.counts[:k])
        return range(first, first + self.counts[k])

    def route(self, length: float) -> range:
        """The routing rule: the instances a request of length L may go to (only its range's)."""
        owned = self.instances_of(self.range_of(length))
        if not owned:
            raise ValueError(f"no instance serves length {length} (range {self.range_of(length)} has none)")
        return owned
