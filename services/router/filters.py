"""Candidate filters every routing policy starts from.

* Fresh and healthy: a heartbeat within the worker's bound (shared.staleness: 10 of the
  intervals it announces; `stale_after_s`, if set, instead), healthy, not draining.
* Accepting: the worker's macro-instance lets it take new requests now (every worker in
  NoDG; only those in their prefill phase under EcoServe, issue 8).
* Same model as the request.
* Batch-size cap (seed 000, §5.1): drop instances whose BS has reached the cap.
* EcoServe (issue 8, a Guard: it narrows the candidates the filters left): on rows of an
  EcoServe macro-instance, keep the workers that pass seed 002's constraint check
  (shared.ecoserve.refusals: TTFT, TPOT, memory) for this request; among those, the ones
  holding the longest cached prefix of it (the worker that served the session last — its
  previous turn's KV is there); if none passes, the least loaded one (running + waiting).
  The scorer then picks among what is kept. Rows outside EcoServe pass untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import Narrowed
from tokenyard.shared.ecoserve import EcoConfig, Refusal, refusals
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class HealthyFilter:
    stale_after_s: float | None = None
    """None: each worker's own bound (shared.staleness); a number: this bound for every one."""
    name: str = "healthy"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray | bool:
        if view.all_healthy() and view.all_fresh(now, self.stale_after_s):
            return True  # the usual fleet: two facts the view keeps, no array operation
        return view.healthy[: view.n] & view.fresh(now, self.stale_after_s)


@dataclass
class AcceptingFilter:
    name: str = "accepting"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray | bool:
        if req.kv_from or view.all_accepting():  # a P/D decode leg: services.router.pd decides
            return True
        return view.accepting[: view.n].copy()


@dataclass
class ModelFilter:
    """Keeps workers that serve the request's model (rows carry it from heartbeats)."""

    name: str = "model"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray | bool:
        codes = view.model_codes
        if len(codes) == 1 and req.model in codes:  # one model ever seen: every row serves it
            return True
        return view.model[: view.n] == codes.get(req.model, -1)


@dataclass
class BatchCapFilter:
    cap: int
    name: str = "bs-cap"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        return view.batch_size(slice(0, view.n)) < self.cap


@dataclass
class EcoServeGuard:
    name: str = "ecoserve"
    refused: dict[str, int] | None = None
    """Refusals counted by reason (Refusal names), for metrics and tests: a running tally the
    owner passes in, not per-decision state."""
    inputs: frozenset[str] = frozenset()
    decisions: int = 0
    """Routing decisions that had EcoServe rows among their candidates."""
    fallbacks: int = 0
    """Of those, the ones where every EcoServe row was refused and the least loaded took the
    request anyway (seed §3.1.2's last resort; issue 13 counts how often)."""

    def narrow(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Narrowed:
        if not view.has_eco:  # no EcoServe row in the fleet: a flag the view keeps, no array call
            return Narrowed(True)
        eco = view.eco[cand]
        if not eco.any():
            return Narrowed(True)
        rows = cand[eco]
        self.decisions += 1
        # Per-row SLOs come from each macro-instance's state; TPOT is the decodes' (their slack).
        why = np.zeros(len(rows), dtype=np.int8)
        for ttft in np.unique(view.eco_ttft_ms[rows]):
            same = view.eco_ttft_ms[rows] == ttft
            r = rows[same]
            why[same] = refusals(
                view.queued_prefill[r],
                view.ms_per_token[r],
                view.slack_ms[r],
                view.kv_free[r],
                view.block_size[r],
                view.new[r],
                req.prompt_len,
                req.max_tokens,
                EcoConfig(ttft_slo_ms=float(ttft)),
            )
        if self.refused is not None:
            for code in why[why != Refusal.OK]:
                name = Refusal(int(code)).name.lower()
                self.refused[name] = self.refused.get(name, 0) + 1
        ok = why == Refusal.OK
        keep = ~eco  # rows outside EcoServe stay
        if ok.any():
            passing = rows[ok]
            hit = view.hit[passing]
            if hit.max() > 0:  # the session's worker: the longest cached prefix
                passing = passing[hit == hit.max()]
            keep |= np.isin(cand, passing)
        else:
            self.fallbacks += 1
            load = view.running[rows] + view.waiting[rows]
            least = rows[load == load.min()]
            keep |= cand == min(least, key=lambda i: view.ids[i])
        return Narrowed(keep, "" if ok.any() else "ecoserve-none-passes")


@dataclass
class VbsFilter:
    """SCORPIO's VBS admission (services/worker/sim/scorpio.py) seen from the router: worker i
    reports its running set's VBS_i, tightest SLO m_i and VBS limit V_i (the largest VBS whose
    estimated TPOT meets m_i). With r's SLO s and m' = min(m_i, s):
        VBS' = VBS_i · m'/m_i + m'/s           (every TRP rescales to the new minimum)
        V'   = V_i · m'/m_i                    (an affine TPOT model with a positive intercept
                                                shrinks the limit at least this much: optimistic,
                                                the worker's own admission has the last word)
        keep ⇔ VBS' ≤ V'
    Requests without a TPOT SLO, and workers that report none (V_i = 0), are not filtered."""

    name: str = "vbs"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray | bool:
        s = req.tpot_slo_ms
        if s <= 0:
            return True
        n = view.n
        limit = view.vbs_limit[:n]
        m = view.min_stp_ms[:n]
        known = (limit > 0) & (m > 0)
        m_safe = np.where(known, m, 1.0)
        m_new = np.minimum(m_safe, s)
        vbs_new = view.vbs[:n] * m_new / m_safe + m_new / s
        return ~known | (vbs_new <= limit * m_new / m_safe)
