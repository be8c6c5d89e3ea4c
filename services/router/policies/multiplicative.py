"""Multiplicative KV$-aware score (seed 000, docs/ARCHITECTURE.md §6):

    hit(r, i) = tokens of r's prompt cached on i (whole blocks, from the KV block index)
    P(r, i)   = queued prefill tokens(i) + max(len(r) − hit(r, i), 1)
    BS(i)     = running(i) + routed to i since its last heartbeat
    score     = P × (BS + 1)              (exact=False, the default)
              = P × BS                    (exact=True: the seed's own product)
    ties      → lower P, then least recently chosen (the picker)

Cache affinity and load check each other with no weight to tune: a full hit (P → queue
only) on a busy instance still loses to a lighter one once its BS is large enough. The seed's
bare P × BS lets any idle instance (BS = 0) win at score 0 whatever its prefill cost; the
+1 keeps P in play there. Optional log-smoothing of P for very long contexts (seed §5.1):
    P' = P                          if P ≤ T
    P' = T · (1 + ln(P / T))        otherwise   (continuous, slope 1 at T)
Under overload it compresses the P gaps that carry load, so it is off by default (T = None);
the guards (services/router/guards.py) are what keep the product from sorting by size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import Scored
from tokenyard.shared.schemas import AdmittedRequest


def smooth(p: np.ndarray, above: float | None) -> np.ndarray:
    if above is None:
        return p
    return np.where(p > above, above * (1.0 + np.log(np.maximum(p, above) / above)), p)


@dataclass
class MultiplicativeScorer:
    exact: bool = False
    log_smooth_above: float | None = None
    name: str = "multiplicative"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        p = smooth(view.p[cand], self.log_smooth_above)  # P = queued + new (FleetView.p)
        bs = view.bs[cand]
        return Scored(p * (bs if self.exact else bs + 1), tiebreak=p)
