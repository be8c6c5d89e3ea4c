"""One simulator run of a workload with given queue knobs → Measures (objective.py).

The cluster simulator (simulator.cluster.ClusterSim) builds its queue policy by name; the
knobs are put in by replacing its policy with `make_policy(name, **knobs)` before the run
(the same registry `tokenyard queue` uses). A request's length is prompt + max_tokens, the
length the bubble queues partition on. The study measures how the queue orders a backlog
it holds, long requests included, so the run turns off what would drop them instead:
admission's SLO refusals and the queue's deadline rejection (SimConfig.slo_check,
deadline_reject); flow control stays as configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

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

    def run(self, params: dict[str, float]) -> Measures:
        from tokenyard.simulator.cluster import ClusterSim

        items = self.workload.items()
        cfg = replace(self.sim_config, slo_check=False, deadline_reject=False)
        sim = ClusterSim(cfg, self.workload.block_tokens)
        sim.queue.policy = make_policy(self.queue_policy, **policy_knobs(params))
        sim.run(items)
        rows = []
        end = items[0].arrival_s if items else 0.0
        for st in sim.reqs.values():
            ok = st.finished and st.error is None and len(st.tokens) > 0
            rows.append((st.item.prompt_len + st.item.max_tokens, st.tokens[0] - st.item.arrival_s if ok else None))
            if len(st.tokens):
                end = max(end, st.tokens[-1])
        start = items[0].arrival_s if items else 0.0
        return measure(rows, end - start, self.classes)
