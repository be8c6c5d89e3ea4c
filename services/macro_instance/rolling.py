"""Rolling activation (seed 002 §2.2.2, docs/ARCHITECTURE.md §7): the phase plan of one EcoServe
macro-instance, one tick at a time. Pure: `now` and the workers' loads come in.

Each worker is in its prefill phase (takes new requests, keeps decoding what it has) or its
decode phase (takes none). Per tick, over the group's workers in their fixed order:
  1. a newcomer starts in decode;
  2. a prefill worker that has held the phase ≥ `min_phase_s` leaves it when its backlog
     is ≤ 2 requests or its compute is saturated (shared.ecoserve.leaves_prefill);
  3. activation, staggered: at most one every `stagger_s`, the next decode worker after
     the one activated last (rotation order) that has held its decode phase ≥ `min_phase_s`
     and whose saved TPOT slack covers 1.5 × the estimated prefill ahead
     (shared.ecoserve.ready_for_prefill) enters its prefill phase. The prefill ahead is estimated as the mean pending prefill time of the group's
     current prefill workers, priced at the candidate's own cost per token;
  4. some worker always accepts: if no prefill worker would remain, the next ready one is
     activated regardless of the stagger; if none is ready, the first leaver stays (or, in
     a group with no prefill worker at all, the worker with the most slack is activated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenyard.shared.ecoserve import MIN_PHASE_S, EcoConfig, WorkerLoad, leaves_prefill, ready_for_prefill
from tokenyard.shared.schemas import Phase


@dataclass
class RollingConfig:
    eco: EcoConfig = field(default_factory=EcoConfig)
    min_phase_s: float = MIN_PHASE_S
    """A worker holds a phase at least this long (no flapping between two heartbeats)."""
    stagger_s: float = 1.0
    """The fixed interval between two activations in one group."""


@dataclass
class Rolling:
    """The phase state of one macro-instance."""

    phases: dict[str, str] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    """When each worker entered its current phase."""
    last: str = ""
    """The worker activated last: the search for the next one starts right after it (at the
    group's first worker if it has left)."""
    last_activation_s: float = float("-inf")

    def _set(self, w: str, phase: str, now: float) -> None:
        self.phases[w] = phase
        self.since[w] = now

    def tick(self, workers: list[str], loads: dict[str, WorkerLoad], now: float, cfg: RollingConfig) -> bool:
        """Advance the plan to `now`; True if any worker's phase changed (incl. arrivals and
        departures). `loads` has every worker of `workers`."""
        changed = False
        for w in list(self.phases):
            if w not in workers:
                del self.phases[w], self.since[w]
                changed = True
        for w in workers:
            if w not in self.phases:
                self._set(w, Phase.DECODE, now)
                changed = True
        prefill = [w for w in workers if self.phases[w] == Phase.PREFILL]
        leaving = [
            w for w in prefill
            if now - self.since[w] >= cfg.min_phase_s
            and leaves_prefill(loads[w].waiting, loads[w].compute_util, cfg.eco)
        ]
        staying = [w for w in prefill if w not in leaving]
        est_tokens = sum(loads[w].pending_tokens for w in prefill) / len(prefill) if prefill else 0.0

        nxt = self._next_ready(workers, loads, est_tokens, now, cfg)
        if nxt is not None and (not staying or now - self.last_activation_s >= cfg.stagger_s):
            self._activate(nxt, now)
            staying.append(nxt)
            changed = True
        if not staying:
            if leaving:
                leaving.pop(0)  # nobody can take over: the first leaver keeps accepting
            elif workers:
                best = max(workers, key=lambda w: _slack_key(loads[w]))
                self._activate(best, now)
                changed = True
        for w in leaving:
            self._set(w, Phase.DECODE, now)
            changed = True
        return changed

    def _next_ready(self, workers: list[str], loads: dict[str, WorkerLoad], est_tokens: float,
                    now: float, cfg: RollingConfig) -> str | None:
        n = len(workers)
        start = workers.index(self.last) + 1 if self.last in workers else 0
        for k in range(n):
            w = workers[(start + k) % n]
            if self.phases[w] != Phase.DECODE or now - self.since[w] < cfg.min_phase_s:
                continue
            load = loads[w]
            if ready_for_prefill(load.slack_ms, load.ms_per_token * est_tokens, cfg.eco):
                return w
        return None

    def _activate(self, w: str, now: float) -> None:
        self._set(w, Phase.PREFILL, now)
        self.last = w
        self.last_activation_s = now

    def accepting(self, workers: list[str]) -> list[str]:
        return [w for w in workers if self.phases.get(w) == Phase.PREFILL]


def _slack_key(load: WorkerLoad) -> tuple[int, float]:
    return (1, 0.0) if load.slack_ms is None else (0, load.slack_ms)
