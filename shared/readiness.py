"""Whether an HTTP front (the edge) can serve now: its `/health`, the readiness a load balancer
or a Kubernetes readinessProbe acts on. `/live` is liveness apart: the process answers, whatever
the fleet (shared/http_front.py) — restart on that, take out of rotation on this. Pure.

    ready  ⇔  NATS connected  ∧  admission answers  ∧  it hears the bus  ∧  workers_up ≥ 1
           → 200 {"status": "ok", "workers_up": n, …}
    else the first that fails, a 503 {"status": "unavailable", "reason", "message", …}:
        nats_disconnected       the front's own connection to the bus is down: nothing goes out
        admission_unavailable   no admission replica answered (an edge of its own asks on
                                llm.v1.admission.health within ASK_S): every request would end
                                in a 503 "admission did not answer in time"
        admission_disconnected  admission is cut off from the bus: it hears no worker
        no_workers              admission counts no worker up (healthy, not draining, heard from
                                within its liveness bound, or one up when admission lost the bus
                                and still within the bound of its reconnect): every request would
                                get a 503 "No worker is up", or wait for one

workers_up is admission's count, by the rule it judges every request by, so the probe and the
answers agree: the edge in admission's process (`tokenyard up`) asks it by a call, an edge
process of its own (`--edge-processes N`, `tokenyard edge`) over NATS, one ask at a time however
many probes come. `workers_reconnecting`, present while some are: those of workers_up silent past
their bound since admission's own return from a bus outage, up as still reconnecting
(services/admission/liveness.py). The front is ready then, as admission admits then: a request
waits in the queue, stored, for their return. A saturated fleet is ready: its 503s (Retry-After)
are per request, and a front taken out of rotation on every burst would flap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenyard.shared import schemas

ASK_S = 0.5
"""How long an edge of its own waits for admission's answer: within the 1 s a Kubernetes probe
waits by default (timeoutSeconds), so the probe hears a reason, not a timeout."""


@dataclass(frozen=True)
class Readiness:
    status: int
    """The HTTP status: 200 ready, 503 not."""
    body: dict[str, Any]


def judge(nats_connected: bool, fleet: schemas.FleetHealth | None, unanswered: str = "") -> Readiness:
    """`fleet`: admission's answer; None, with `unanswered` saying why (no responders, no answer
    in time), when none came."""
    if not nats_connected:
        return _unavailable("nats_disconnected", "this front is not connected to NATS")
    if fleet is None:
        return _unavailable("admission_unavailable", f"no admission answers: {unanswered or 'not asked'}")
    counts = {"workers_up": fleet.workers_up, "workers_known": fleet.workers_known}
    if fleet.workers_reconnecting:
        counts["workers_reconnecting"] = fleet.workers_reconnecting
    if not fleet.observing:
        return _unavailable("admission_disconnected", "admission is cut off from NATS: it hears no worker", counts)
    if fleet.workers_up < 1:
        heard = "none has been heard from" if fleet.workers_known == 0 else \
            f"{fleet.workers_known} known, none heard from lately, or every one draining or unhealthy"
        return _unavailable("no_workers", f"No worker is up ({heard})", counts)
    return Readiness(200, {"status": "ok", **counts})


def _unavailable(reason: str, message: str, counts: dict[str, int] | None = None) -> Readiness:
    return Readiness(503, {"status": "unavailable", "reason": reason, "message": message, **(counts or {})})
