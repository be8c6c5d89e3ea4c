"""Mitosis acted on: the controller's ProvisionOps start and stop simulated workers.

    add      a new worker (w<next>) heartbeats provision_delay_s later (PROVISION event):
             the live vLLM worker takes 20–50 s to start before it registers
    remove   the drained worker finishes what it holds, then stops: it sends nothing more
             and falls stale in every core, as a stopped process does
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.simulator.config import MODEL
from tokenyard.simulator.events import PROVISION
from tokenyard.simulator.fleet import SimInstance

if TYPE_CHECKING:
    from tokenyard.simulator.cluster import ClusterSim


def provision(sim: ClusterSim, plan_ops, now: float) -> None:
    """Log each op; `add` queues the worker's start, `remove` marks it retiring."""
    for op in plan_ops:
        sim.scaling_log.append((now, op.kind, op.macro_id, op.worker_id))
        if op.kind == "add":
            sim.events.push(now + sim.cfg.provision_delay_s, PROVISION, op.macro_id)
        elif op.kind == "remove":
            sim.retiring.add(op.worker_id)


def provisioned(sim: ClusterSim, macro_id: str, now: float) -> None:
    """The worker asked for has started: it joins the fleet (its first heartbeat at the next tick)."""
    wid = f"w{len(sim.instances):0{sim.width}d}"
    inst = SimInstance(wid, MODEL, sim.prof, sim.block_size, sim.num_blocks, sim.tpot_ms,
                       sim.cfg.flow_control, **sim.engine_options)
    sim.add_instance(inst)
    sim.scaling_log.append((now, "started", macro_id, wid))


def retire(sim: ClusterSim, now: float) -> None:
    """Retiring workers with nothing left to do stop."""
    for wid in sorted(sim.retiring):
        inst = sim.by_id[wid]
        if not inst.busy and not inst.engine.has_work() and not inst.worker.streams:
            sim.retiring.discard(wid)
            sim.stopped.add(wid)
            sim.scaling_log.append((now, "stopped", "", wid))
