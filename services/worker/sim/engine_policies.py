"""The simulated engine's scheduling policies by name, for `tokenyard worker --engine sim`
and the cluster simulator to select with one option:

    vllm          vLLM V1's (scheduler.py): FCFS, every running request every step
    scorpio       SCORPIO's VBS admission, credit batching, SLO-fitted token budget (scorpio.py)
    priority-kv   KV regions by priority class, reclaiming after a step (kv_priority.py), on vLLM's
    scorpio+kv    both: SCORPIO inside the priority regions
"""

from __future__ import annotations

from tokenyard.services.worker.sim.kv_priority import PriorityKVPolicy
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.scheduler import SchedulingPolicy, VllmPolicy
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy

ENGINE_POLICIES = ("vllm", "scorpio", "priority-kv", "scorpio+kv")


def make_engine_policy(name: str, prof: LatencyProfile, default_tpot_slo_ms: float = 100.0) -> SchedulingPolicy:
    if name == "vllm":
        return VllmPolicy()
    if name == "scorpio":
        return ScorpioPolicy(prof, default_tpot_slo_ms)
    if name == "priority-kv":
        return PriorityKVPolicy()
    if name == "scorpio+kv":
        return PriorityKVPolicy(ScorpioPolicy(prof, default_tpot_slo_ms))
    raise ValueError(f"unknown engine policy {name!r}; choose from {', '.join(ENGINE_POLICIES)}")
