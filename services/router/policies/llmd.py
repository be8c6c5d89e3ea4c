"""llm-d's inference-scheduler policies (baselines), scores higher-better in [0, 1] turned
into a cost (−Σ) for the argmin picker.

`llmd` — the default scheduling profile: weighted scorers, max-score picker
    prefix-cache-scorer          × 3   matched blocks / request blocks
    queue-scorer                 × 2   (max q − q(i)) / (max q − min q) over the candidates,
                                       1 when all are equal; q = waiting requests
    kv-cache-utilization-scorer  × 2   1 − KV blocks used / KV blocks
  (weights: llm-d's guides/inference-scheduling EPP config; the same 3/2/2 is Red Hat AI's
  documented default profile).

`llmd-token-load` — the newer optimized-baseline profile ("sticky until saturated"):
  prefix-cache-affinity-filter, then token-load-scorer
    sticky(i)   = matched blocks / full prompt blocks ≥ affinity_threshold (0.8)
    TTFT(i)     = in-flight prefill tokens(i) / peak prefill rate (15,928 tokens/s)
    keep sticky instances only, unless none is sticky or the best sticky TTFT trails the best
    non-sticky one by more than max_ttft_penalty (18 s; 0 disables the gate)
    token-load  = 1 − min(1, (in-flight prefill tokens(i) + uncached tokens(r, i)) / 4,194,304)
  (defaults: llm-d tokenload scorer, `tokenQueueThresholdDefault` = 4194304, "128 requests @
  32K"; the affinity filter's, as Dynamo's port of llm-d's guides/optimized-baseline carries
  them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.guards import new_tokens
from tokenyard.services.router.pipeline import Narrowed, Scored
from tokenyard.shared.schemas import AdmittedRequest


def prefix_score(req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> np.ndarray:
    bs = max(req.block_size, 1)
    blocks = req.prompt_len // bs
    if blocks == 0:
        return np.zeros(len(cand))
    return np.minimum(view.hit[cand] // bs, blocks) / blocks


@dataclass
class LlmdWeightedScorer:
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    name: str = "llmd"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        q = view.waiting[cand].astype(np.float64)
        lo, hi = q.min(), q.max()
        queue = (hi - q) / (hi - lo) if hi > lo else np.ones(len(cand))
        used = view.kv_used[cand].astype(np.float64)
        total = used + view.kv_free[cand]
        kv = 1.0 - np.divide(used, total, out=np.zeros(len(cand)), where=total > 0)
        kv = np.clip(kv, 0.0, 1.0)
        return Scored(
            -(self.prefix_weight * prefix_score(req, view, cand) + self.queue_weight * queue + self.kv_weight * kv)
        )


@dataclass
class LlmdAffinityGuard:
    """prefix-cache-affinity-filter (it compares candidates, so it is a Guard here)."""

    affinity_threshold: float = 0.8
    max_ttft_penalty_s: float = 18.0
    peak_prefill_tokens_per_s: float = 15_928.0
    name: str = "prefix-cache-affinity"
    inputs: frozenset[str] = frozenset()

    def narrow(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Narrowed:
        sticky = prefix_score(req, view, cand) >= self.affinity_threshold
        if self.affinity_threshold <= 0 or not sticky.any():
            return Narrowed(np.ones(len(cand), dtype=np.bool_))
        if sticky.all() or self.max_ttft_penalty_s == 0:
            return Narrowed(sticky, "sticky")
        ttft = view.queued_prefill[cand] / self.peak_prefill_tokens_per_s
        if ttft[sticky].min() - ttft[~sticky].min() > self.max_ttft_penalty_s:
            return Narrowed(np.ones(len(cand), dtype=np.bool_), "saturated")
        return Narrowed(sticky, "sticky")


@dataclass
class LlmdTokenLoadScorer:
    queue_threshold_tokens: float = 4_194_304.0
    name: str = "llmd-token-load"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        tokens = view.queued_prefill[cand] + new_tokens(req, view, cand)
        return Scored(-(1.0 - np.minimum(tokens / self.queue_threshold_tokens, 1.0)))
