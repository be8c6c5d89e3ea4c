"""Spatial P/D in the simulator (mode `pd`): a prefill worker's engine hands a request off
after its first token; its KV crosses the inter-node link and lands as a decode leg

    KV_ARRIVE at  handoff + prompt KV bytes / inter-node bandwidth (LatencyProfile.network_s)

which the router places on a decode worker (services.router.pd) as the router shell does,
retrying with the refusing worker excluded; a leg no decode worker takes waits for the next
tick. The decode worker's engine starts it prefilled (SimEngineCore.add_prefilled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from tokenyard.services.router.core import Placement
from tokenyard.shared import schemas
from tokenyard.simulator.events import KV_ARRIVE

if TYPE_CHECKING:
    from tokenyard.simulator.cluster import ClusterSim
    from tokenyard.simulator.fleet import SimInstance


def place_leg(sim: ClusterSim, req: schemas.AdmittedRequest, now: float) -> bool:
    """A decode leg (its KV sent): to a decode worker, as the router places it; kept for the
    next tick if none takes it."""
    placement = Placement(sim.router, req)
    while (choice := placement.next(now)) is not None:
        inst = sim.by_id[choice.worker_id]
        reply, start = inst.worker.offer(req, inst.engine.stats())
        if reply.accepted:
            if start:
                sim.start(inst, req, now)
            return True
        placement.refused(inst.id, reply.reason)
    sim.legs.append(req)
    return False


def hand_off(sim: ClusterSim, inst: SimInstance, now: float) -> None:
    """Requests the prefill worker finished prefilling: their KV goes out over the inter-node
    link; each lands as a decode leg after its transfer time."""
    for req, cached in inst.engine.handed_off:
        inst.worker.streams.pop(req.request_id, None)
        sim.reqs[req.request_id].cached_tokens = cached
        leg = msgspec.structs.replace(req, kv_from=inst.id)
        sim.events.push(now + sim.prof.network_s(req.prompt_len), KV_ARRIVE, leg)
        sim.handoffs += 1
    inst.engine.handed_off.clear()
