"""Least loaded (vLLM production-stack style load balancing, no cache awareness):

    score(i) = running(i) + waiting(i)   (requests outstanding on i)

with the optimistic +1 on waiting at each decision. Ties → least recently chosen."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest


class LeastLoadedScorer:
    name = "least-loaded"

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> np.ndarray:
        return (view.running[cand] + view.waiting[cand]).astype(np.float64)
