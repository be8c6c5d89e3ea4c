"""One simulator run of a workload with given queue knobs → Measures (objective.py).

The cluster simulator (simulator.cluster.ClusterSim) builds its queue policy by name; the
knobs are put in by replacing its policy with `make_policy(name, **knobs)` before the run
(the same registry `tokenyard queue` uses). A request's length is prompt + max_tokens, the
length the bubble queues partition on. The study measures how the queue orders a backlog
it holds, long requests included, so the run turns off what would drop them instead:
admission's SLO refusals and the queue's deadline rejection (SimConfig.slo_check,
deadline_reject); flow control stays as configured.

`PartitionedSetup` is seed 004's other baseline: the instances split by length range
(services/priority_queue/policies/bubble_partitions.py), each range a fleet of its own with its
own FCFS queue, fed only its range's requests; the ranges run side by side on the same clock
and are measured as one fleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tokenyard.services.priority_queue.policies.bubble_partitions import FixedPartitions
from tokenyard.services.priority_queue.policies.registry import make_policy
from tokenyard.tuning.objective import Classes, Measures, measure

KNOB_DEFAULTS: dict[str, float] = {"bubble_width": 1024.0, "aging_p1_s": 30.0, "aging_p2_s": 15.0, "aging_p3_s": 5.0}


def policy_knobs(params: dict[str, float]) -> dict[str, Any]:
    """Search parameters → make_policy keywords."""
    p = KNOB_DEFAULTS | params
    return {"bubble_width": p["bubble_width"],
            "aging_s": (float("inf"), p["aging_p1_s"], p["aging_p2_s"], p["aging_p3_s"])}


@dataclass
class SimSetup:
    workload: Any
    """name, block_tokens, items() → list[TraceRequest] (loadgen.workloads)."""
    sim_config: Any
    """simulator.cluster.SimConfig."""
    queue_policy: str = "bubble"
    classes: Classes = field(default_factory=Classes)
    make: Callable[..., Any] = make_policy
    """Builds the queue policy from (name, **knobs): the registry's, or a variant to compare."""
    refusals: bool = False
    """True: admission's SLO refusals and the queue's deadline rejection as `sim_config` has
    them (on by default: what a user gets) instead of off (the study's setting)."""

    def run(self, params: dict[str, float]) -> Measures:
        from tokenyard.simulator.cluster import ClusterSim

        items = self.workload.items()
        cfg = _study(self.sim_config, self.refusals)
        sim = ClusterSim(cfg, self.workload.block_tokens)
        sim.queue.policy = self.make(self.queue_policy, **policy_knobs(params))
        sim.run(items)
        return _measures(items, list(sim.reqs.values()), self.classes)


def _study(sim_config: Any, refusals: bool) -> Any:
    return sim_config if refusals else replace(sim_config, slo_check=False, deadline_reject=False)


def _measures(items: list, states: list, classes: Classes) -> Measures:
    """(length, TTFT or None) per request, over the span from the first arrival to the last token."""
    rows = []
    start = items[0].arrival_s if items else 0.0
    end = start
    for st in states:
        ok = st.finished and st.error is None and len(st.tokens) > 0
        rows.append((st.item.prompt_len + st.item.max_tokens, st.tokens[0] - st.item.arrival_s if ok else None))
        if len(st.tokens):
            end = max(end, st.tokens[-1])
    return measure(rows, end - start, classes)


def run_partitioned(items: list, sim_config: Any, block_tokens: int, parts: FixedPartitions,
                    refusals: bool = False) -> dict[str, tuple[int, Any]]:
    """Each range's requests through a fleet of its own (parts.counts[k] instances, an FCFS
    queue), same admission and queue settings as SimSetup (`refusals` as there). Returns request id → (the global
    index of the instance that served it, or −1; its ReqState)."""
    from tokenyard.simulator.cluster import ClusterSim

    if sim_config.instances != parts.instances:
        raise ValueError(f"the split covers {parts.instances} instances, the fleet has {sim_config.instances}")
    by_range: dict[int, list] = {}
    for it in items:
        by_range.setdefault(parts.range_of(it.prompt_len + it.max_tokens), []).append(it)
    out: dict[str, tuple[int, Any]] = {}
    for k, sub in sorted(by_range.items()):
        owned = parts.instances_of(k)
        cfg = replace(_study(sim_config, refusals), instances=len(owned))
        sim = ClusterSim(cfg, block_tokens)
        sim.queue.policy = make_policy("fcfs")
        sim.run(sub)
        local = {inst.id: i for i, inst in enumerate(sim.instances)}
        for rid, st in sim.reqs.items():
            out[rid] = (owned[local[st.worker]] if st.worker else -1, st)
    return out


@dataclass
class PartitionedSetup:
    """Seed 004's fixed partitions: `sim_config.instances` split over the length ranges in
    proportion to each range's prefill time on the instances' latency profile
    (FixedPartitions.for_requests), unless `counts` gives the split."""

    workload: Any
    sim_config: Any
    classes: Classes = field(default_factory=Classes)
    counts: tuple[int, ...] | None = None
    refusals: bool = False
    """As SimSetup.refusals."""

    def partitions(self) -> FixedPartitions:
        if self.counts is not None:
            return FixedPartitions(tuple(self.counts))
        from tokenyard.services.worker.sim.latency import profile

        prof = profile(self.sim_config.profile)
        return FixedPartitions.for_requests(
            ((it.prompt_len + it.max_tokens, prof.prefill_s(it.prompt_len)) for it in self.workload.items()),
            self.sim_config.instances)

    def run(self, params: dict[str, float] | None = None) -> Measures:
        items = self.workload.items()
        served = run_partitioned(items, self.sim_config, self.workload.block_tokens, self.partitions(), self.refusals)
        return _measures(items, [st for _, st in served.values()], self.classes)
