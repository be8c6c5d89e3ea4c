"""Least loaded (vLLM production-stack style load balancing, no cache awareness):

    score(i) = running(i) + waiting(i)   (requests outstanding on i)

with the optimistic +1 on waiting at each decision. Ties → least recently chosen."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import Scored
from tokenyard.shared.schemas import AdmittedRequest


class LeastLoadedScorer:
    name = "least-loaded"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        return Scored((view.running[cand] + view.waiting[cand]).astype(np.float64))
