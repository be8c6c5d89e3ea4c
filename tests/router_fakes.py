"""Small hand-written pieces for the router's tests: a scorer with fixed scores, a pipeline
around it, and a router core with a policy by name."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.filters import HealthyFilter
from tokenyard.services.router.pipeline import ArgminPicker, Pipeline, Scored


class FixedScorer:
    """Scores given per worker id."""

    name = "fixed"
    inputs = frozenset()

    def __init__(self, scores: dict[str, float]):
        self.scores = scores

    def score(self, req, view, cand):
        return Scored(np.array([self.scores[view.ids[i]] for i in cand]))


def pipeline(scorer, filters=None) -> Pipeline:
    """A pipeline of `scorer` behind the healthy filter (1 s stale), or behind `filters`."""
    return Pipeline("t", [HealthyFilter(1.0)] if filters is None else filters, scorer, ArgminPicker())


def router(policy: str, stale: float = 1.0) -> RouterCore:
    return RouterCore(RouterConfig(policy=policy, stale_after_s=stale, forget_after_s=60.0))
