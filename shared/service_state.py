"""What the queue replicas and admission say of themselves on the bus: a queue's state on
`llm.v1.pq.state` (QueueStats, which admission reads for SLO feasibility) and admission's view of
the fleet for an HTTP front's readiness (FleetHealth, on `llm.v1.admission.health`). Read as
schemas.X, as every message is; new fields go only at the end, with defaults."""

from __future__ import annotations

import msgspec
from tokenyard.shared.ints import Int64


class QueueStats(msgspec.Struct, omit_defaults=True):
    """A priority-queue replica's state on `llm.v1.pq.state` (~every 100 ms), which admission
    reads for SLO feasibility: the work waiting per class and how fast the fleet takes it."""

    instance_id: str
    ts: float
    policy: str
    depth: list[Int64]
    """Requests waiting, per class P0..P3."""
    work_tokens: list[Int64]
    """Σ (prompt + max_tokens) of the waiting requests, per class P0..P3."""
    in_flight: Int64 = 0
    drain_tokens_per_s: float = 0.0
    """Recent rate of work leaving for the fleet (routed), prompt + max_tokens per second."""
    drain_requests_per_s: float = 0.0
    headroom: Int64 = 0
    """Free worker slots the queue may still fill (> 0: the queue is not the bottleneck)."""
    seen_arrival_s: float = 0.0
    """The latest `arrival_s` (admission's clock) among the requests this queue has taken in
    from JetStream: admission keeps counting what it admitted after it (not yet in `work_tokens`);
    0 = unknown (admission then counts from this state on)."""
    drain_measured: bool = True
    """False: the queue held no backlog for long enough to measure a drain (0 then is no rate,
    not a stalled queue: what leaves an empty queue is the demand)."""
    flow_control: bool = True
    """The queue releases by its flow control's room in prompt tokens (QueueConfig.flow_control;
    False: by slots): admission then bounds the drain by the rate that room reopens at
    (services/admission/wait_terms.py `release_rate`)."""


class FleetHealth(msgspec.Struct, omit_defaults=True):
    """Admission's view of the fleet for an HTTP front's readiness (shared/readiness.py), on
    `llm.v1.admission.health` (any replica answers) or by a call in admission's own process."""

    workers_up: Int64
    """Workers up now as admission judges them (healthy, not draining, fresh: liveness.py)."""
    workers_known: Int64
    """Workers it has heard from at all."""
    observing: bool = True
    """It hears the bus: a cut-off admission's count is stale."""
    workers_reconnecting: Int64 = 0
    """Of workers_up, those counted up only as still reconnecting after admission's own return
    from a bus outage (services/admission/liveness.py: not heard since, within the bound)."""
