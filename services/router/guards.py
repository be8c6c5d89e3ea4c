"""Guards: filters that keep the multiplicative score honest under overload.

Why: under overload the bare product P × (BS + 1) sorts requests by size. A long prompt's
own uncached tokens dominate P on every instance (P ≈ len(r) everywhere), so the product
reduces to len(r) × (BS + 1) and the request lands wherever the fewest sequences run,
however much prefill is already queued there; the instance that took long prompts has few
running (they wait in its prefill queue), so it keeps attracting long prompts, while short
ones avoid its queue and pile onto the others.

* Prefill-budget guard (the TTFT guard), a Guard (it compares candidates with each other, so
  it runs after the filters, on the candidates they left). The request's predicted time to
  first token on i is
      T(r, i) = (queued prefill tokens(i) + new tokens(r, i)) / prefill rate
  Keep the instances with T ≤ budget(r) (the class's TTFT target). When none can meet it
  (overload), keep those with T ≤ (1 + slack) × min_j T(r, j): the request may not join a
  prefill queue much longer than the shortest one, whatever its size, which is exactly the
  freedom the size-sorting needs. The product still picks among the kept ones.
* Batch-size cap (seed 000, §5.1): drop instances whose BS has reached the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import FINITE_TTFT_TARGET_S

TTFT_BUDGET_S = FINITE_TTFT_TARGET_S
"""TTFT targets of P0…P3 (shared.slo; P3 has none, and gets P2's so its guard still works)."""

PREFILL_TOKENS_PER_S = 15_000.0
"""One instance's prefill rate: the a100-llama3-8b profile's 65.7 µs per prompt token
(services/worker/sim/latency.py, from data/calibration) gives 15.2 k tokens/s; llm-d
calibrates 15,928 tokens/s for its optimized-baseline guide. Override per deployment."""


def new_tokens(req: AdmittedRequest, view: FleetView, rows: np.ndarray) -> np.ndarray:
    """The request's uncached prompt tokens on each row (FleetView.new, set by the core)."""
    return view.new[rows]


@dataclass
class PrefillBudgetFilter:
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    budgets_s: tuple[float, ...] = TTFT_BUDGET_S
    slack: float = 0.25
    name: str = "prefill-budget"
    over_budget: bool = False
    """Whether the last call found no instance within budget (for the decision's record)."""

    def budget(self, req: AdmittedRequest) -> float:
        return self.budgets_s[min(max(req.priority, 0), len(self.budgets_s) - 1)]

    def narrow(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> np.ndarray:
        p = view.p[cand]  # T = p / rate, compared in tokens
        within = p <= self.budget(req) * self.prefill_tokens_per_s
        self.over_budget = not within.any()
        if not self.over_budget:
            return within
        return p <= (1.0 + self.slack) * p.min()


@dataclass
class BatchCapFilter:
    cap: int
    name: str = "bs-cap"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        return view.batch_size(slice(0, view.n)) < self.cap
