"""Candidate filters every routing policy starts from.

* Fresh and healthy: a heartbeat within `stale_after_s`, healthy, not draining.
* Accepting: the worker's macro-instance lets it take new requests now (every worker in
  NoDG; only those in their prefill phase under EcoServe, issue 8).
* Same model as the request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.router.fleet import FleetView
from shared import config
from shared.schemas import AdmittedRequest


@dataclass
class HealthyFilter:
    stale_after_s: float = config.STALE_AFTER_S
    name: str = "healthy"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        return view.healthy[: view.n] & view.fresh(now, self.stale_after_s)


@dataclass
class AcceptingFilter:
    name: str = "accepting"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        return view.accepting[: view.n].copy()


@dataclass
class ModelFilter:
    """Keeps workers that serve the request's model (rows carry it from heartbeats)."""

    name: str = "model"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        return view.model[: view.n] == view.model_codes.get(req.model, -1)
