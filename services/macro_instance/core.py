"""The macro-instance controller's core: group the fleet's workers into macro-instances,
decide each worker's phase, and scale the groups (docs/ARCHITECTURE.md §7). Pure: heartbeats and
`now` come in; plans go out; the live shell and the cluster simulator both drive it.

Membership is stable: a worker seen in heartbeats joins the macro-instance that asked for
it (a pending growth), else the first one with fewer than `size` members, else a new one
(ids m0, m1, … in creation order, never reused); a worker silent for `stale_after_s` leaves
its group. Modes:
  nodg      every worker is `mixed` and accepts new requests;
  ecoserve  rolling activation (services.macro_instance.rolling): each worker alternates
            between its prefill phase (accepting) and its decode phase, staggered so some
            worker of the group always accepts.
  pd        spatial P/D (DistServe, MoonCake): the group's first `pd_prefill` workers (in
            join order) are prefill workers (phase `prefill`, accepting new requests, each
            request handed off after its first token), the rest decode workers (phase
            `decode`, taking the hand-offs; services.router.pd).
With `scaling` set, mitosis (services.macro_instance.mitosis) grows, splits, shrinks and
merges the groups; worker additions and removals go out as ProvisionOps. Its growth rule reads
the workers' heartbeats and the priority queue's states (`llm.v1.pq.state`, on_queue_stats):
under flow control the backlog of a saturated fleet waits in the queue, where heartbeats do
not show it.

plan(now) → the MacroStates that changed (epoch + 1), the WorkerControls for workers whose
reported macro id or phase differs from the plan, and the ProvisionOps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenyard.services.macro_instance.mitosis import Decision, Mitosis, MitosisConfig, backlog_late_share
from tokenyard.services.macro_instance.rolling import Rolling, RollingConfig
from tokenyard.shared.ecoserve import WorkerLoad, load_of
from tokenyard.shared.schemas import Heartbeat, MacroState, Phase, QueueStats, WorkerControl

MODES = ("nodg", "ecoserve", "pd")


@dataclass
class MacroConfig:
    size: int = 4
    mode: str = "nodg"
    stale_after_s: float = 3.0
    rolling: RollingConfig = field(default_factory=RollingConfig)
    """EcoServe's phase rules and SLOs (mode `ecoserve`)."""
    scaling: MitosisConfig | None = None
    """Mitosis scaling; None: the fleet is what the heartbeats show."""
    pd_prefill: int | None = None
    """Mode `pd`: prefill workers per macro-instance; None: half of it, rounded up. A group
    of one worker has no decode worker and runs mixed."""


@dataclass(frozen=True)
class ProvisionOp:
    """`add`: start one worker for `macro_id` (it joins once its heartbeats arrive);
    `remove`: stop `worker_id` (already drained and out of its group)."""

    kind: str
    macro_id: str
    worker_id: str = ""


@dataclass
class Plan:
    states: list[MacroState] = field(default_factory=list)
    controls: list[WorkerControl] = field(default_factory=list)
    provision: list[ProvisionOp] = field(default_factory=list)
    scaled: list[Decision] = field(default_factory=list)
    """Mitosis's decisions applied this plan, for logs and plots; a split names the new
    macro-instance in `into`."""


@dataclass
class _Reported:
    hb: Heartbeat
    seen_s: float


class MacroCore:
    def __init__(self, cfg: MacroConfig):
        if cfg.mode not in MODES:
            raise ValueError(f"unknown mode '{cfg.mode}'; known: {', '.join(MODES)}")
        if cfg.size < 1:
            raise ValueError("macro-instance size must be ≥ 1")
        if cfg.pd_prefill is not None and not 1 <= cfg.pd_prefill < cfg.size:
            raise ValueError(f"pd_prefill must leave both roles in a macro-instance of {cfg.size}: 1 … {cfg.size - 1}")
        self.cfg = cfg
        self.reported: dict[str, _Reported] = {}
        self.groups: dict[str, list[str]] = {}
        self.states: dict[str, MacroState] = {}
        self.rolling: dict[str, Rolling] = {}
        self.mitosis = Mitosis(cfg.scaling) if cfg.scaling else None
        self.pending_joins: list[str] = []
        """Macro-instances waiting for a worker the provisioner is starting (FIFO)."""
        self.retiring: set[str] = set()
        """Workers removed by a shrink: kept out of the groups until they fall silent."""
        self.queues: dict[str, tuple[float, QueueStats]] = {}
        """Queue replica → (seen at, its latest state)."""
        self.backlog_share = 0.0
        """Mitosis: the queue's late-backlog share at the latest plan (mitosis.backlog_late_share)."""
        self._next = 0

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.reported[hb.worker_id] = _Reported(hb, now)

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now`: as `on_heartbeat` with it (the
        controller reads a heartbeat's contents and its arrival time, not its own `ts`/`seq`);
        False for a worker never heard from."""
        r = self.reported.get(worker_id)
        if r is None:
            return False
        r.seen_s = now
        return True

    def on_queue_stats(self, stats: QueueStats, now: float) -> None:
        self.queues[stats.instance_id] = (now, stats)

    def _fresh_queues(self, now: float) -> list[QueueStats]:
        return [s for seen, s in self.queues.values() if now - seen <= self.cfg.stale_after_s]

    def load(self, worker_id: str) -> WorkerLoad:
        return load_of(self.reported[worker_id].hb)

    def _new_id(self) -> str:
        mid = f"m{self._next}"
        self._next += 1
        return mid

    def _drop(self, mid: str) -> None:
        del self.groups[mid]
        self.rolling.pop(mid, None)
        if self.mitosis:
            self.mitosis.forget(mid)

    def plan(self, now: float) -> Plan:
        plan = Plan()
        alive = {w for w, r in self.reported.items() if now - r.seen_s <= self.cfg.stale_after_s}
        self.retiring &= alive
        alive -= self.retiring
        changed: set[str] = set()
        for mid, ws in self.groups.items():
            keep = [w for w in ws if w in alive]
            if keep != ws:
                self.groups[mid] = keep
                changed.add(mid)
        member = {w for ws in self.groups.values() for w in ws}
        for w in sorted(alive - member):
            self.pending_joins = [m for m in self.pending_joins if m in self.groups]
            if self.pending_joins:
                mid = self.pending_joins.pop(0)
            else:
                mid = next((m for m, ws in self.groups.items() if len(ws) < self.cfg.size), None)
                if mid is None:
                    mid = self._new_id()
                    self.groups[mid] = []
            self.groups[mid].append(w)
            changed.add(mid)
        for mid in [m for m, ws in self.groups.items() if not ws]:
            self._drop(mid)
        if self.mitosis:
            self._scale(now, plan, changed)
        if self.cfg.mode == "ecoserve":
            for mid, ws in self.groups.items():
                r = self.rolling.setdefault(mid, Rolling())
                if r.tick(ws, {w: self.load(w) for w in ws}, now, self.cfg.rolling):
                    changed.add(mid)
        for mid in sorted(changed):
            state = self._state(mid, now)
            if state is not None:
                plan.states.append(state)
        for mid, state in self.states.items():
            for w in state.workers:
                hb = self.reported[w].hb
                if hb.macro_id != mid or hb.phase != state.phases[w]:
                    plan.controls.append(WorkerControl(w, state.phases[w], mid, epoch=state.epoch, mode=state.mode))
        for w in sorted(self.retiring):
            if not self.reported[w].hb.draining:
                plan.controls.append(WorkerControl(w, self.reported[w].hb.phase, "", drain=True))
        return plan

    def _state(self, mid: str, now: float) -> MacroState | None:
        ws = self.groups.get(mid)
        if ws is None:  # emptied or merged away: announce it once with no workers
            old = self.states.pop(mid, None)
            if old is None:
                return None
            return MacroState(mid, self.cfg.mode, [], {}, [], old.epoch + 1, now)
        epoch = self.states[mid].epoch + 1 if mid in self.states else 1
        if self.cfg.mode == "ecoserve":
            r = self.rolling[mid]
            phases = {w: str(r.phases[w]) for w in ws}
            eco = self.cfg.rolling.eco
            state = MacroState(mid, self.cfg.mode, list(ws), phases, r.accepting(ws), epoch, now,
                               eco.ttft_slo_ms, eco.tpot_slo_ms)
        elif self.cfg.mode == "pd" and len(ws) > 1:
            phases = pd_roles(ws, self.cfg.pd_prefill)
            accepting = [w for w in ws if phases[w] == Phase.PREFILL]
            state = MacroState(mid, self.cfg.mode, list(ws), phases, accepting, epoch, now)
        else:
            state = MacroState(mid, self.cfg.mode, list(ws), {w: str(Phase.MIXED) for w in ws}, list(ws), epoch, now)
        self.states[mid] = state
        return state

    def _scale(self, now: float, plan: Plan, changed: set[str]) -> None:
        assert self.mitosis is not None
        ttft = self.cfg.rolling.eco.ttft_slo_ms
        self.backlog_share = backlog_late_share(self._fresh_queues(now), ttft)
        for mid, ws in self.groups.items():
            loads = [self.load(w) for w in ws]
            util = sum(x.compute_util for x in loads) / len(loads)
            missing = sum(1 for x in loads if (x.slack_ms is not None and x.slack_ms < 0) or x.prefill_ms() > ttft)
            self.mitosis.observe(mid, now, util, max(missing / len(loads), self.backlog_share))
        for d in self.mitosis.decide(self.groups, now, len(self.pending_joins)):
            if d.kind == "grow":
                self.pending_joins.append(d.macro_id)
                plan.provision.append(ProvisionOp("add", d.macro_id))
            elif d.kind == "split":
                new = self._new_id()
                self.groups[d.macro_id] = [w for w in self.groups[d.macro_id] if w not in d.workers]
                self.groups[new] = list(d.workers)
                changed.update((d.macro_id, new))
                d = Decision(d.kind, d.macro_id, d.workers, new)
            elif d.kind == "shrink":
                w = d.workers[0]
                self.groups[d.macro_id].remove(w)
                self.retiring.add(w)
                plan.provision.append(ProvisionOp("remove", d.macro_id, w))
                changed.add(d.macro_id)
            elif d.kind == "merge":
                self.groups[d.into].extend(w for w in self.groups[d.macro_id] if w not in self.groups[d.into])
                self._drop(d.macro_id)
                changed.update((d.macro_id, d.into))
            plan.scaled.append(d)
        for mid in [m for m, ws in self.groups.items() if not ws]:
            self._drop(mid)
            changed.add(mid)


def pd_roles(workers: list[str], prefill: int | None) -> dict[str, str]:
    """Spatial P/D roles of a group: the first `prefill` workers (half, rounded up, when
    None; at least one of each role) prefill, the rest decode."""
    n = len(workers)
    k = min(max(1, -(-n // 2) if prefill is None else prefill), n - 1)
    return {w: str(Phase.PREFILL if i < k else Phase.DECODE) for i, w in enumerate(workers)}
