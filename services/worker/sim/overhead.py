"""What a live step of the simulated engine costs beyond its modelled time (the worker's loop,
publishing the outputs, a CPU shared with other processes): SCORPIO's TPOT budget keeps it out
of its SLO bound and its TTFT guard adds it to every step (SimEngineCore.step_overhead_s; the
cluster simulator's virtual clock has none).

    sample   = max(0, wall time between two deliveries − the step's modelled wall time) × speed
               (in the profile's seconds: a worker at --speed X steps X times as fast)
    estimate = the median of the last WINDOW samples (0 before the first)

A robust average, not an EWMA: one long pause (a GC, the OS scheduler, a burst of publishing)
is one sample and moves the median by at most one rank, so it cannot starve the budget for the
steps after it (an EWMA of weight 0.1 carried a 500 ms pause as 50 ms, then 45, 40 …, more than a
50 ms SLO's whole step for a dozen steps); a machine that stays slower moves the estimate within
WINDOW / 2 steps, which is what the budget must follow.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 32
"""Samples the median is taken over (~1 s of 30 ms steps)."""


class StepOverhead:
    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError("the overhead window must hold at least one sample")
        self._samples: deque[float] = deque(maxlen=window)
        self.estimate = 0.0
        """Seconds (the profile's) a step costs beyond its model: the window's median."""

    def add(self, sample_s: float) -> float:
        """One step's measured overhead (negative: the step came early, counted as 0); the new estimate."""
        self._samples.append(sample_s if sample_s > 0.0 else 0.0)
        self.estimate = statistics.median(self._samples)
        return self.estimate
