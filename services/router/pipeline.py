"""Routing is filter → scorer → picker (llm-d's scheduler profile, Dynamo's WorkerFilter /
WorkerScorer / WorkerPicker), each a one-method port:

    candidates = ∩ filters            (boolean masks over the fleet's rows)
    scores     = scorer(candidates)   (finite, lower is better — checked here, not by scorers)
    choice     = picker(scores)       (default: argmin, ties → least recently chosen → worker id)

Scorers read the FleetView arrays (and, from issue 5, prefix-hit lengths the shell looked up
once and attached to the request's snapshot); they never query an index themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from services.router.fleet import FleetView
from shared.schemas import AdmittedRequest


class Filter(Protocol):
    name: str

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        """A boolean mask over rows 0…view.n-1: which workers stay candidates."""


class Scorer(Protocol):
    name: str

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> np.ndarray:
        """One score per candidate row index in `cand`; lower is better."""


class Picker(Protocol):
    def pick(self, view: FleetView, cand: np.ndarray, scores: np.ndarray) -> int:
        """The chosen row among `cand`."""


class ArgminPicker:
    """Lowest score; ties → least recently chosen (never chosen first) → smallest worker id."""

    def pick(self, view: FleetView, cand: np.ndarray, scores: np.ndarray) -> int:
        best = cand[scores == scores.min()]
        if len(best) == 1:
            return int(best[0])
        lc = view.last_chosen[best]
        best = best[lc == lc.min()]
        return int(min(best, key=lambda i: view.ids[i]))


@dataclass
class Choice:
    worker_id: str | None
    reason: str = ""
    candidates: int = 0


@dataclass
class Pipeline:
    name: str
    filters: list[Filter]
    scorer: Scorer
    picker: Picker

    def choose(
        self, req: AdmittedRequest, view: FleetView, now: float, exclude: frozenset[str] = frozenset()
    ) -> Choice:
        if view.n == 0:
            return Choice(None, "no workers known")
        mask = np.ones(view.n, dtype=np.bool_)
        for f in self.filters:
            mask &= f.keep(req, view, now)
            if not mask.any():
                return Choice(None, f"no candidate passed filter '{f.name}'")
        for wid in exclude:
            i = view.slot.get(wid)
            if i is not None:
                mask[i] = False
        cand = np.flatnonzero(mask)
        if len(cand) == 0:
            return Choice(None, "every candidate refused")
        scores = np.asarray(self.scorer.score(req, view, cand), dtype=np.float64)
        if scores.shape != cand.shape or not np.isfinite(scores).all():
            raise ValueError(f"scorer '{self.scorer.name}' must return one finite score per candidate")
        return Choice(view.ids[self.picker.pick(view, cand, scores)], candidates=len(cand))
