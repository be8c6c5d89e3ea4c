"""The macro-instance controller's core: group the fleet's workers into macro-instances and
decide each worker's phase (DESIGN.md §3.4).

Membership is stable: a worker seen in heartbeats joins the first macro-instance with fewer
than `size` members (else a new one, ids m0, m1, … in creation order); a worker silent for
`stale_after_s` leaves its group. Mode NoDG (the first mode): every worker is `mixed` and
accepts new requests. EcoServe's rolling prefill activation (issue 8) is another mode of
the same plan: it changes `phases` / `accepting`, not the plumbing.

plan(now) → the MacroStates that changed (epoch + 1) and the WorkerControls to send to
workers whose reported macro id or phase differs from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.schemas import Heartbeat, MacroState, Phase, WorkerControl

MODES = ("nodg",)


@dataclass
class MacroConfig:
    size: int = 4
    mode: str = "nodg"
    stale_after_s: float = 3.0


@dataclass
class Plan:
    states: list[MacroState] = field(default_factory=list)
    controls: list[WorkerControl] = field(default_factory=list)


@dataclass
class _Reported:
    macro_id: str
    phase: str
    seen_s: float


class MacroCore:
    def __init__(self, cfg: MacroConfig):
        if cfg.mode not in MODES:
            raise ValueError(f"unknown mode '{cfg.mode}'; known: {', '.join(MODES)}")
        if cfg.size < 1:
            raise ValueError("macro-instance size must be ≥ 1")
        self.cfg = cfg
        self.reported: dict[str, _Reported] = {}
        self.groups: dict[str, list[str]] = {}
        self.states: dict[str, MacroState] = {}
        self._next = 0

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.reported[hb.worker_id] = _Reported(hb.macro_id, hb.phase, now)

    def _member_of(self) -> dict[str, str]:
        return {w: mid for mid, ws in self.groups.items() for w in ws}

    def plan(self, now: float) -> Plan:
        alive = {w for w, r in self.reported.items() if now - r.seen_s <= self.cfg.stale_after_s}
        changed: set[str] = set()
        for mid, ws in self.groups.items():
            keep = [w for w in ws if w in alive]
            if keep != ws:
                self.groups[mid] = keep
                changed.add(mid)
        member = self._member_of()
        for w in sorted(alive - member.keys()):
            mid = next((m for m, ws in self.groups.items() if len(ws) < self.cfg.size), None)
            if mid is None:
                mid = f"m{self._next}"
                self._next += 1
                self.groups[mid] = []
            self.groups[mid].append(w)
            changed.add(mid)
        for mid in [m for m, ws in self.groups.items() if not ws]:
            del self.groups[mid]
        plan = Plan()
        for mid in sorted(changed):
            ws = self.groups.get(mid)
            if ws is None:  # emptied: announce it once with no workers
                old = self.states.pop(mid, None)
                if old is not None:
                    plan.states.append(MacroState(mid, self.cfg.mode, [], {}, [], old.epoch + 1, now))
                continue
            epoch = self.states[mid].epoch + 1 if mid in self.states else 1
            phases = {w: str(Phase.MIXED) for w in ws}
            state = MacroState(mid, self.cfg.mode, list(ws), phases, list(ws), epoch, now)
            self.states[mid] = state
            plan.states.append(state)
        for mid, state in self.states.items():
            for w in state.workers:
                r = self.reported[w]
                if r.macro_id != mid or r.phase != state.phases[w]:
                    plan.controls.append(WorkerControl(w, state.phases[w], mid, epoch=state.epoch))
        return plan
