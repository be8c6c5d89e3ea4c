"""Spatial prefill/decode disaggregation (DistServe, MoonCake; Dynamo's and llm-d's P/D) as a
router filter: a macro-instance in mode `pd` has prefill workers and decode workers.

    new request (kv_from = "")   → a prefill worker: the accepting filter keeps only those
                                   (the macro state lists them as accepting)
    decode leg  (kv_from = w)    → a decode worker of the same model; the prefill worker w
                                   sends the KV (at the inter-node bandwidth) and the first
                                   token already went out from w

The macro-instance controller decides the roles (services.macro_instance.core, mode `pd`);
the router learns them from MacroState.phases: `decode` ⇒ a decode worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest, MacroState, Phase


def pd_decode(state: MacroState, worker_id: str) -> bool:
    """Is the worker a decode instance of a spatial P/D macro-instance?"""
    return state.mode == "pd" and state.phases.get(worker_id) == Phase.DECODE


@dataclass
class PdLegFilter:
    name: str = "pd-leg"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray | bool:
        if not req.kv_from:
            return True  # a new request: the accepting filter keeps the prefill workers
        return view.pd_decode[: view.n].copy()
