"""NVIDIA Dynamo's KV router cost (baseline), in blocks of the request's block size B:

    prefill(i) = prefill_load_scale × max(queued prefill tokens(i)/B + len(r)/B
                                          − overlap_credit × hit blocks(r, i), 0)
    decode(i)  = KV blocks in use on i (+ this request's blocks, the same for every i)
    cost(i)    = prefill(i) + decode(i)
    pick       = argmin cost at temperature 0; at T > 0 sample softmax(−ĉ / T), ĉ = the costs
                 min-max normalised to [0, 1]

Defaults are Dynamo's (docs: components/router "Configuration and Tuning"):
`--router-prefill-load-scale` 1, `--router-kv-overlap-score-credit` (formerly
`--router-kv-overlap-score-weight`) 1, `--router-temperature` 0. Dynamo tracks active
prefill tokens and decode blocks itself; here they come from heartbeats plus the router's
optimistic additions (FleetView.note_routed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import ArgminPicker, Scored
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class DynamoScorer:
    prefill_load_scale: float = 1.0
    overlap_credit: float = 1.0
    name: str = "dynamo"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        bs = max(req.block_size, 1)
        hit_blocks = view.hit[cand] // bs
        prefill = (view.queued_prefill[cand] + req.prompt_len) / bs - self.overlap_credit * hit_blocks
        decode = view.kv_used[cand] + -(-req.prompt_len // bs)
        return Scored(self.prefill_load_scale * np.maximum(prefill, 0.0) + decode)


class SoftmaxPicker:
    """Dynamo's worker selection: argmin at temperature 0 (ties as ArgminPicker), else one
    draw from softmax(−normalised cost / T) with the injected generator."""

    def __init__(self, temperature: float, rng: np.random.Generator):
        self.temperature = temperature
        self.rng = rng
        self._argmin = ArgminPicker()

    def pick(
        self, view: FleetView, cand: np.ndarray, scores: np.ndarray, tiebreak: np.ndarray | None = None
    ) -> int:
        if self.temperature <= 0 or len(cand) == 1:
            return self._argmin.pick(view, cand, scores, tiebreak)
        lo, hi = scores.min(), scores.max()
        norm = (scores - lo) / (hi - lo) if hi > lo else np.zeros_like(scores)
        w = np.exp(-(norm - norm.min()) / self.temperature)
        return int(cand[self.rng.choice(len(cand), p=w / w.sum())])
