"""SGLang router's `cache_aware` policy (baseline):

    load(i)     = requests in flight on i (running + waiting, with the router's own +1s)
    imbalanced  = max load − min load > balance_abs_threshold
                  and max load > balance_rel_threshold × min load
    imbalanced  → the least loaded instance (shortest queue)
    otherwise   → match rate(i) = cached prompt tokens(r, i) / len(r);
                  if max match rate > cache_threshold → the instance with the longest match,
                  else → the instance with the smallest cache tree (most room to cache r)

Defaults are sgl-model-gateway's RouterArgs (bindings/python/src/sglang_router/router_args.py):
cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5 (older sglang-router
releases used 0.5 / 32 / 1.0001). SGLang matches against its own approximate radix tree of
what it routed; here the match comes from the KV block index (precise, or approximate with a
TTL for engines without events) and the tree size is the blocks the index holds for i.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class SglangCacheAwareScorer:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    name: str = "sglang"
    tree_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """Blocks the index holds per FleetView row, set by the core before each decision."""
    mode: str = ""
    """What decided the last call: `balance`, `cache` or `tree` (for tests and spans)."""

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> np.ndarray:
        load = (view.running[cand] + view.waiting[cand]).astype(np.float64)
        lo, hi = load.min(), load.max()
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            self.mode = "balance"
            return load
        hit = view.hit[cand].astype(np.float64)
        if req.prompt_len > 0 and hit.max() / req.prompt_len > self.cache_threshold:
            self.mode = "cache"
            return -hit
        self.mode = "tree"
        return self.tree_blocks[cand].astype(np.float64)
