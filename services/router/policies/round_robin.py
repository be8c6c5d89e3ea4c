"""Round robin: every candidate in turn. Score = the decision number at which the worker was
last chosen (−1 if never), so the least recently chosen wins and the fleet is cycled; ties
(never chosen) break on worker id. Blind to load and cache: the baseline floor."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import Scored
from tokenyard.shared.schemas import AdmittedRequest


class RoundRobinScorer:
    name = "round-robin"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        return Scored(view.last_chosen[cand].astype(np.float64))
