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
TTL for engines without events) and the tree size is the blocks the index holds for i
(the `tree_blocks` input, which the scorer declares and the core builds). The note says
what decided: `balance`, `cache` or `tree`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import TREE_BLOCKS, Scored
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class SglangCacheAwareScorer:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    name: str = "sglang"
    inputs: frozenset[str] = frozenset({TREE_BLOCKS})

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        load = (view.running[cand] + view.waiting[cand]).astype(np.float64)
        lo, hi = load.min(), load.max()
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return Scored(load, note="balance")
        hit = view.hit[cand].astype(np.float64)
        if req.prompt_len > 0 and hit.max() / req.prompt_len > self.cache_threshold:
            return Scored(-hit, note="cache")
        return Scored(view.tree_blocks[cand].astype(np.float64), note="tree")
