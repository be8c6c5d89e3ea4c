"""Routing is filter → scorer → picker (llm-d's scheduler profile, Dynamo's WorkerFilter /
WorkerScorer / WorkerPicker), each a one-method port:

    candidates = ∩ filters            (boolean masks over the fleet's rows)
    candidates = guards(candidates)   (narrowings that compare candidates with each other)
    scores     = scorer(candidates)   (finite, lower is better — checked here, not by scorers)
    choice     = picker(scores)       (default: argmin, ties → least recently chosen → worker id)

Scorers read the FleetView arrays, including the prefix-hit lengths the core looked up once
for this request (`view.hit`, `view.new`, `view.p`); they never query an index themselves. A
scorer that needs a column the core builds only on demand declares it in `inputs` (Dynamo's
selectors declare the worker inputs they require; today: `tree_blocks`), and the core fills
it before the pipeline runs. Per-decision results travel back in return values, never as
attributes left on a scorer or guard: `score` returns `Scored(scores, tiebreak, note)` (the
picker breaks score ties on the tiebreak, lower first, before recency) and a guard's
`narrow` returns `Narrowed(keep, note)`; the notes land on the decision (`Choice.notes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
from tokenyard.services.router import kernels
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import OfferPrefill

TREE_BLOCKS = "tree_blocks"
"""An on-demand input: blocks the KV index holds per FleetView row (`view.tree_blocks`)."""
INPUTS = frozenset({TREE_BLOCKS})
"""Every column a scorer or guard may declare in `inputs`."""


class Scored(NamedTuple):
    scores: np.ndarray
    """One score per candidate; lower is better; finite (checked by Pipeline.choose)."""
    tiebreak: np.ndarray | None = None
    """One value per candidate breaking score ties (lower first), or None."""
    note: str = ""
    """What decided, for the decision's record (e.g. SGLang's `balance` / `cache` / `tree`)."""


class Narrowed(NamedTuple):
    keep: np.ndarray | bool
    """A boolean mask over the candidates: which stay (never all False); or True: all of them
    (a guard with nothing to say spares the pipeline a mask and a copy of the candidates)."""
    note: str = ""
    """Why the guard narrowed as it did, when that is worth recording (e.g. `over-budget`)."""


class Filter(Protocol):
    name: str

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        """A boolean mask over rows 0…view.n-1 (or a scalar True: all of them): which workers
        stay candidates."""


class Guard(Protocol):
    name: str
    inputs: frozenset[str]

    def narrow(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Narrowed:
        """A boolean mask over `cand` (row indices), or True (all): which candidates stay. A
        guard that would keep none must keep some (it narrows, it does not refuse)."""


class Scorer(Protocol):
    name: str
    inputs: frozenset[str]
    """On-demand FleetView columns this scorer reads (a subset of INPUTS)."""

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        """One score per candidate row index in `cand`; lower is better."""


class Picker(Protocol):
    def pick(
        self, view: FleetView, cand: np.ndarray, scores: np.ndarray, tiebreak: np.ndarray | None = None
    ) -> int:
        """The chosen row among `cand`."""


class ArgminPicker:
    """Lowest score; ties → lowest tiebreak (if the scorer gave one) → least recently chosen
    (never chosen first) → smallest worker id."""

    def pick(
        self, view: FleetView, cand: np.ndarray, scores: np.ndarray, tiebreak: np.ndarray | None = None
    ) -> int:
        # the numbers in one compiled pass (services/router/kernels.py), the ids here
        tb = _NO_TIEBREAK if tiebreak is None else np.asarray(tiebreak, dtype=np.float64)
        best = kernels.argmin_tied(np.asarray(scores, dtype=np.float64), tb, view.last_chosen, np.asarray(cand, dtype=np.int64))
        if len(best) == 1:
            return int(best[0])
        return int(min(best, key=lambda i: view.ids[i]))


_NO_TIEBREAK = np.empty(0)


OVER_BUDGET = "over-budget"


@dataclass
class Choice:
    """A routing decision and its inputs (the shell puts them on its span, the simulator
    records them). P, BS and hit are the chosen instance's, whatever the policy scored."""

    worker_id: str | None
    reason: str = ""
    candidates: int = 0
    row: int = -1
    """The chosen row of the FleetView at decision time (−1 if none)."""
    score: float = 0.0
    """The policy's score of the chosen instance (lower is better)."""
    policy: str = ""
    """The pipeline that decided: the configured policy, or `round-robin` in fallback."""
    p_tokens: float = 0.0
    """P: prefill tokens queued on the instance + the request's uncached tokens there."""
    batch_size: int = 0
    """BS: the instance's running sequences + those routed to it since its last heartbeat."""
    hit_tokens: int = 0
    """Prompt tokens of the request cached on the instance (whole blocks)."""
    fallback: str = ""
    """`round-robin` while the hot-spot detector's fallback holds, else empty."""
    hot_warning: bool = False
    """Stage 1 of the hot-spot detector warned for this request's prefix."""
    notes: tuple[str, ...] = ()
    """What the guards and the scorer noted on the way (Narrowed.note, Scored.note)."""
    prefill: OfferPrefill | None = None
    """r's uncached tokens on the chosen instance and the fewest on any other not excluded
    (RouterCore.route; the offer's header, which the worker's `saturated` refusal weighs);
    None: no other instance."""

    @property
    def over_budget(self) -> bool:
        """No candidate could meet the request's TTFT budget (the prefill-budget guard's note)."""
        return OVER_BUDGET in self.notes


@dataclass
class Pipeline:
    name: str
    filters: list[Filter]
    scorer: Scorer
    picker: Picker
    guards: list[Guard] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inputs = frozenset(self.scorer.inputs).union(*(g.inputs for g in self.guards))
        if not self.inputs <= INPUTS:
            raise ValueError(f"pipeline '{self.name}' declares unknown inputs {sorted(self.inputs - INPUTS)}")

    def choose(
        self, req: AdmittedRequest, view: FleetView, now: float, exclude: frozenset[str] = frozenset()
    ) -> Choice:
        if view.n == 0:
            return Choice(None, "no workers known", policy=self.name)
        # The decision's hot path (`tokenyard bench router`): a filter that keeps every row
        # answers a scalar True and costs no array operation here.
        masks = [f.keep(req, view, now) for f in self.filters]
        arrays = [m for m in masks if m is not True and m is not np.True_]
        if not arrays:  # every filter kept every row (the usual fleet)
            mask, cand = None, view.every_row()
        else:
            mask = arrays[0].copy()
            for m in arrays[1:]:
                mask &= m
            cand = mask.nonzero()[0]  # the mask is 1-D: flatnonzero less its Python-level ravel
        if len(cand) == 0:  # name the filter that emptied the candidates (the rare path)
            mask[:] = True
            for f, m in zip(self.filters, masks, strict=True):
                mask &= m
                if not mask.any():
                    return Choice(None, f"no candidate passed filter '{f.name}'", policy=self.name)
        if exclude:
            if mask is None:
                mask = np.ones(view.n, dtype=np.bool_)
            for wid in exclude:
                i = view.slot.get(wid)
                if i is not None:
                    mask[i] = False
            cand = mask.nonzero()[0]  # the mask is 1-D: flatnonzero less its Python-level ravel
            if len(cand) == 0:
                return Choice(None, "every candidate refused", policy=self.name)
        notes: list[str] = []
        for g in self.guards:
            keep, note = g.narrow(req, view, cand)
            if note:
                notes.append(note)
            if keep is True:
                continue
            kept = cand[keep]
            if len(kept) == 0:
                raise ValueError(f"guard '{g.name}' kept no candidate")
            cand = kept
        scored = self.scorer.score(req, view, cand)
        scores = np.asarray(scored.scores, dtype=np.float64)
        # One sum catches any nan or ±inf (finite scores here are far from overflowing it);
        # np.add.reduce is ndarray.sum without its Python-level wrapper (the hot path).
        if scores.shape != cand.shape or not math.isfinite(np.add.reduce(scores)):
            raise ValueError(f"scorer '{self.scorer.name}' must return one finite score per candidate")
        tiebreak = scored.tiebreak
        if tiebreak is not None and (tiebreak.shape != cand.shape or not math.isfinite(np.add.reduce(tiebreak))):
            raise ValueError(f"scorer '{self.scorer.name}' must give one finite tiebreak per candidate")
        if scored.note:
            notes.append(scored.note)
        k = self.picker.pick(view, cand, scores, tiebreak)
        score = float(scores[cand.searchsorted(k)])
        return Choice(view.ids[k], candidates=len(cand), row=k, score=score, policy=self.name, notes=tuple(notes))
