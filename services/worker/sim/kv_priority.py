"""KV memory by priority (seed 001 §4, DESIGN §3.5) as a scheduling policy wrapping another
(vLLM's or SCORPIO's), through the engine's policy seam.

Regions over the engine's T blocks, by the running requests' classes (used_c = their blocks):
    P0       reserved: hard floor 15% of T, soft ceiling 40%
    P1       elastic: up to 35% of T
    P2, P3   shared: whatever is free, including reserved space nobody uses (borrowing)
A waiting request of class c that the free blocks cannot hold (need = its uncomputed tokens
in blocks) may reclaim blocks from lower classes, within its entitlement:
    P0: from P2/P3 while used_0 + need ≤ 40%·T, and from P1 while used_0 + need ≤ 15%·T
    P1: from P2/P3 while used_1 + need ≤ 35%·T
Victims follow the engine's one preemption rule (scheduler.victim_key: the lowest class,
then the latest arrival); they are preempted after their current step (no priority
inversion: a step in flight completes), at the start of the next (`due_victims`, the core
preempts them), and the claimant is admitted then. The waiting line serves classes in order (P0 first), preempted requests
first within their class, then the wrapped policy's order (arrival, or deadline for SCORPIO).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.scheduler import KeyedLine, SchedulingPolicy, VllmPolicy, victim_key
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy, deadline

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.seq import Seq


@dataclass(frozen=True)
class Regions:
    p0_floor: float = 0.15
    p0_ceiling: float = 0.40
    p1_share: float = 0.35


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PriorityKVPolicy(SchedulingPolicy):
    def __init__(self, inner: SchedulingPolicy | None = None, regions: Regions = Regions()) -> None:
        self.inner = inner or VllmPolicy()
        self.regions = regions
        self.marked: list[Seq] = []
        """Victims to preempt at the start of the next step."""
        self.core: SimEngineCore | None = None
        self.reclaims = 0
        """Claims that marked victims."""
        self.rejects_past_deadline = self.inner.rejects_past_deadline
        self.guards_tpot = self.inner.guards_tpot
        self.class_ordered = self.inner.class_ordered  # its line is by class; which running requests a step runs is the inner's

    def new_waiting_line(self) -> KeyedLine:
        by_deadline = isinstance(self.inner, ScorpioPolicy)

        def key(seq: Seq, preempted: bool) -> tuple:
            return (seq.req.priority, 0 if preempted else 1, deadline(seq) if by_deadline else 0.0)

        return KeyedLine(key)

    def used_by_class(self, running: Sequence[Seq]) -> list[int]:
        used = [0, 0, 0, 0]
        for s in running:
            used[min(max(s.req.priority, 0), 3)] += s.blocks
        return used

    def folds(self, running: list[Seq]) -> bool:
        return not self.marked and self.inner.folds(running)

    def due_victims(self, core: SimEngineCore) -> Sequence[Seq]:
        marked, self.marked = self.marked, []
        return [*marked, *self.inner.due_victims(core)]

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        return self.inner.step_batch(running)

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        self.core = core
        if not self.inner.admit(seq, core):
            return False
        c = min(max(seq.req.priority, 0), 3)
        free = core.pool.available
        need = _cdiv(max(seq.target - seq.computed, 1), core.block_size)
        if c >= 2 or need <= free or self.marked:
            return True  # the core's own block check decides (a claim in progress: wait for it)
        total = core.pool.total
        used = self.used_by_class(core.running)
        r = self.regions
        if c == 0:
            lowest = 0 if used[0] + need <= r.p0_floor * total else (
                1 if used[0] + need <= r.p0_ceiling * total else None)
        else:
            lowest = 1 if used[1] + need <= r.p1_share * total else None
        if lowest is None:
            return True  # beyond its region: only free blocks, which the core checks
        pool = sorted((s for s in core.running if s.req.priority > max(c, lowest)), key=victim_key,
                      reverse=True)
        freed, chosen = 0, []
        for v in pool:
            if free + freed >= need:
                break
            chosen.append(v)
            freed += v.blocks
        if free + freed >= need and chosen:
            self.marked = chosen
            self.reclaims += 1
        return False

    def heartbeat_fields(self, core: SimEngineCore) -> dict[str, float]:
        return self.inner.heartbeat_fields(core)

    def token_budget(self, core: SimEngineCore) -> int:
        return self.inner.token_budget(core)

    def prefill_step(self, core: SimEngineCore, decodes: list[Seq]) -> tuple[int, float]:
        return self.inner.prefill_step(core, decodes)
