"""How a preempted request gives its KV blocks back (DESIGN §3.5, seed 001).

    recompute  free its blocks; it re-prefills prompt + generated tokens later (vLLM V1's only mode)
    swap       copy its KV to the host tier (t_swap = KV bytes / host link, paid in the step that
               preempts and again in the step that resumes it); it resumes where it stopped
    auto       swap when t_swap < 0.3 × t_recompute (the prefill time of what it has computed),
               else recompute

Swap needs room in the host tier; without it a swap falls back to recompute.

Who is preempted is the scheduler's (scheduler.preemption_victim: the lowest class, then the
latest arrival; a policy's claims come back from `due_victims`); how is here:
    preempt(core, v)           v leaves the running set for the waiting line's front
    preempt_for(core, seq, …)  out of blocks in a step: victims until `seq` can grow (or is
                               one); a victim scheduled earlier in the step gives its tokens back
    preempt_due(core)          the victims the policy's earlier claims returned
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.scheduler import preemption_victim

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.seq import Seq

AUTO_SWAP_RATIO = 0.3
"""Seed 001: swap when its transfer takes less than 0.3 × the recompute."""


class PreemptionMode(enum.StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"
    AUTO = "auto"


def wants_swap(mode: PreemptionMode, prof: LatencyProfile, kv_tokens: int) -> bool:
    if mode is PreemptionMode.RECOMPUTE or kv_tokens == 0:
        return False
    if mode is PreemptionMode.SWAP:
        return True
    return prof.transfer_s(kv_tokens) < AUTO_SWAP_RATIO * prof.prefill_s(kv_tokens)


def preempt(core: SimEngineCore, victim: Seq) -> None:
    core.running.remove(victim)
    victim.running = False
    kv_tokens = victim.computed
    blocks = victim.blocks
    if wants_swap(core.preemption_mode, core.prof, kv_tokens) and core.host.reserve_swap(blocks):
        victim.swapped = blocks
        core.step_transfer_s += core.prof.transfer_s(kv_tokens)
        core.swaps += 1
        core.free(victim)
    else:
        core.free(victim)
        victim.target = victim.req.prompt_len + victim.generated
        victim.computed = 0
    core.waiting.push_front(victim)
    core.preemptions += 1


def preempt_for(core: SimEngineCore, seq: Seq, end: int, budget: int, decodes: list[Seq],
                chunks: dict[Seq, int]) -> int:
    """Out of blocks: preempt the policy's victims until `seq` can hold `end` tokens, or
    it is the victim itself; a victim scheduled earlier in this step gives its tokens back.
    Returns the budget left."""
    while True:
        victim = preemption_victim(core.running)
        if victim in chunks:
            budget += chunks.pop(victim)
        elif victim is not seq and victim in decodes:
            decodes.remove(victim)
            budget += 1
        preempt(core, victim)
        if victim is seq or core.grow(seq, end):
            return budget


def preempt_due(core: SimEngineCore) -> None:
    """The victims of the policy's earlier claims (`due_victims`), preempted before this
    step's batch is built."""
    for victim in core.policy.due_victims(core):
        if victim.running:
            preempt(core, victim)
