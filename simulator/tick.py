"""What the fleet does every 100 ms of virtual time (one TICK), in the live services' order:

    heartbeats   each worker that changed since its last heartbeat (a step, a request, a
                 control) sends one (WorkerCore.heartbeat) to the router, queue, admission
                 and macro-instance cores; an unchanged one repeats it every keepalive_s as a
                 keep-alive: each core takes its latest heartbeat again at the new time
                 (`on_keepalive`, the same state as the heartbeat itself), or asks for the
                 heartbeat where a route changed its view since (then the heartbeat goes)
    controller   MacroCore.plan ─> router (MacroState), workers (WorkerControl), mitosis's
                 provisioning; EcoServe phases ─> engines (as WorkerShell._sync_phase)
    samples      every sample_s: batch sizes and the spread of P×BS over the fleet
    retries      an engine whose last step found nothing to schedule steps again; with
                 SCORPIO's rejection path every engine drops waiting requests past deadline
    dispatch     P/D legs waiting for a decode worker, then the queue (expire, dispatchable)
    queue state  QueueCore.stats ─> admission, controller (llm.v1.pq.state live)

A worker's state reaches the cores exactly as with a heartbeat every tick: a worker that
did not change would publish the same numbers, and the cores read only the numbers and
when they came (stale_after_s), so only the time is sent.

Silent ticks (SimConfig.quiet_ticks). A tick T with another tick before the next arrival
(T + heartbeat_s < H), the queue empty, no other event queued (no DISPATCH, KV_ARRIVE,
PROVISION) and no macro-instance controller is followed by nothing but engine steps and
that next tick before H: its dispatch routes nothing, and until H no core is read (a step's
KV events go to the router's block index, not its fleet view). Its queue state to
admission is superseded by the next tick's, and so is each changed worker's heartbeat:

    every core's on_heartbeat overwrites what the worker's previous one wrote (the fields
    admission keeps only when positive, prefill cost and output share, are constant and 0
    for a simulated worker), and a keep-alive is the latest heartbeat again at a new time

so the core's state at the next read is that of the worker's last send alone — save one
field: admission's liveness keeps each worker's longest recent heartbeat gap (a decayed
maximum), which fewer heartbeats change; it only decides whether a worker counts as up, and
in the simulator no worker's silence at a read reaches the 1 s floor, so no verdict changes
(tests/test_sim_across.py compares the up/down verdicts at every arrival). A silent
tick therefore holds a changed worker's heartbeat back (`owed`): a busy worker is changed
again at the next tick, which sends its stats then (or, held back again, the one after);
a worker that went idle has its stats kept (`owed_stats`) and sent at their own time by the
next tick that is not silent, or before a keep-alive of it — each worker's sends reach the
cores in its own order, and the cores keep workers apart (sums of integers, per-row
columns, a lower bound that only speeds a look-up). Nothing else a silent tick does reads
a heartbeat. A fold across ticks (across.py) keeps stats only for the ticks that read them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tokenyard.shared.schemas import EngineStats, Phase
from tokenyard.simulator import scaling
from tokenyard.simulator.events import TICK
from tokenyard.simulator.pd import place_leg

if TYPE_CHECKING:
    from tokenyard.simulator.cluster import ClusterSim
    from tokenyard.simulator.fleet import SimInstance


def tick(sim: ClusterSim, now: float, more: bool = True) -> None:
    """One round at `now`; the next is queued while anything is left to do (`more`: arrivals)."""
    cfg = sim.cfg
    if sim.retiring:
        scaling.retire(sim, now)
    quiet = silent(sim, now)
    heartbeats(sim, now, quiet)
    if sim.macro is not None:
        control(sim, now)
    if not sim.sample_times or now - sim.sample_times[-1] >= cfg.sample_s - 1e-9:
        sample(sim, now)
    retry(sim, now)
    legs, sim.legs = sim.legs, []
    for leg in legs:
        place_leg(sim, leg, now)
    sim.dispatch(now)
    if not quiet:  # (a silent tick's is superseded by the next tick's before admission reads it)
        qstats = sim.queue.stats("sim-queue", now)  # live: on llm.v1.pq.state every 100 ms
        sim.admission.on_queue_stats(qstats, now)
        if sim.macro is not None:  # mitosis's backlog signal
            sim.macro.on_queue_stats(qstats, now)
    if (more or len(sim.queue) or sim.legs or sim.retiring
            or any(inst.busy or inst.engine.has_work() for inst in sim.instances)):
        sim.events.push(now + cfg.heartbeat_s, TICK)


def silent(sim: ClusterSim, now: float) -> bool:
    """The tick at `now` is followed by nothing that reads a core before the next tick (the
    module's "silent ticks"); across.Ticks predicts the same from a fold's start."""
    return (sim.quiet_ticks and now + sim.cfg.heartbeat_s < sim.next_arrival < math.inf and not len(sim.queue)
            and sim.events.only_steps() and not sim.legs)


def heartbeats(sim: ClusterSim, now: float, quiet: bool = False) -> None:
    """Each changed worker's heartbeat, each unchanged one's keep-alive when due; at a silent
    tick (`quiet`) a changed worker's is held back, to be superseded or sent later."""
    stopped, keepalive = sim.stopped, sim.cfg.keepalive_s
    for inst in sim.instances:
        if inst.dirty:
            if stopped and inst.id in stopped:  # a stopped worker sends nothing: it falls silent
                continue
            if quiet and inst.last_hb is not None:
                inst.owed = inst.last_hb_s = now
                inst.owed_stats = None if inst.busy else inst.stats_at(now)  # busy: changed at the next tick
            else:
                inst.owed = inst.owed_stats = None  # superseded: this heartbeat carries the worker as of now
                send(sim, inst, inst.stats_at(now) if inst.ahead else inst.engine.stats(), now)
            inst.dirty = inst.busy
        elif inst.owed is not None and not (quiet and now - inst.last_hb_s < keepalive):
            if stopped and inst.id in stopped:
                continue
            pay(sim, inst)
            if now - inst.last_hb_s >= keepalive:
                send(sim, inst, inst.stats_at(now) if inst.ahead else inst.engine.stats(), now)
        elif now - inst.last_hb_s >= keepalive:
            if stopped and inst.id in stopped:
                continue
            send(sim, inst, inst.stats_at(now) if inst.ahead else inst.engine.stats(), now)


def send(sim: ClusterSim, inst: SimInstance, stats: EngineStats, now: float) -> None:
    """The worker's heartbeat with `stats` at `now` to every core, or a keep-alive where it
    repeats the latest and every core takes it as that."""
    last = inst.last_hb
    same = last is not None and inst.worker.repeats(last, stats)
    if same:
        for keep in sim.keepers:  # a core that would see more change asks for the heartbeat
            if not keep(inst.id, now):
                same = False
                break
    if not same:
        hb = inst.last_hb = inst.worker.heartbeat(stats, now)
        for receive in sim.receivers:
            receive(hb, now)
    inst.last_hb_s = now


def pay(sim: ClusterSim, inst: SimInstance) -> None:
    """The heartbeat a silent tick held back for a worker that was not busy, sent as then."""
    assert inst.owed_stats is not None, "a busy worker's held-back heartbeat was not superseded"
    owed, inst.owed = inst.owed, None
    send(sim, inst, inst.owed_stats, owed)
    inst.owed_stats = None


def control(sim: ClusterSim, now: float) -> None:
    """The macro-instance controller's plan, acted on: states to the router, controls to the
    workers, mitosis's decisions logged and its workers provisioned, engines' phases set."""
    plan = sim.macro.plan(now)
    for state in plan.states:
        sim.router.on_macro_state(state)
    for d in plan.scaled:
        sim.scaling_log.append((now, d.kind, d.macro_id, d.into))
    if plan.provision:
        scaling.provision(sim, plan.provision, now)
    for ctl in plan.controls:
        target = sim.by_id.get(ctl.worker_id)
        if target is not None:
            target.worker.on_control(ctl)
            target.dirty = True
    for inst in sim.instances:  # EcoServe: the engine runs the phase its worker says
        inst.engine.hand_off = inst.worker.hands_off  # spatial P/D's prefill workers
        if inst.worker.phase != Phase.MIXED:  # (as WorkerShell._sync_phase does live)
            phase = inst.worker.engine_phase(inst.stats_at(now))
            if phase != inst.engine.phase:
                inst.engine.set_phase(phase)
                inst.dirty = True


def retry(sim: ClusterSim, now: float) -> None:
    """An engine that could not schedule anything steps again; with SCORPIO's rejection path
    every engine first drops its waiting requests past deadline. Instance order, as a pass
    over the whole fleet would take them."""
    if sim.expiring:
        again = sim.instances
    elif sim.stalled:
        again = sorted(sim.stalled.values(), key=lambda inst: sim.rank[inst.id])
    else:
        return
    for inst in again:
        engine = inst.engine
        if engine.waiting and engine.expire(now):
            inst.dirty = True
        if not inst.busy and engine.has_work():
            sim.step(inst, now)


def sample(sim: ClusterSim, now: float) -> None:
    """Batch size per instance, the fleet's size, and the variance of P×BS over the fleet."""
    sim.sample_times.append(now)
    macro = sim.macro
    groups = len(macro.groups) if macro is not None else 0
    backlog = macro.backlog_share if macro is not None else 0.0
    sim.fleet_samples.append((now, len(sim.instances) - len(sim.stopped), groups, backlog))
    products = []
    for inst in sim.instances:
        s = inst.stats_at(now)
        inst.bs_samples.append(min(s.running, 65535))
        products.append(float(s.queued_prefill_tokens) * s.running)
    mean = sum(products) / len(products)
    sim.pbs_var.append(sum((p - mean) ** 2 for p in products) / len(products))
