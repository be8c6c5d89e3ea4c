"""The priority queue's core: hold admitted requests in the order a policy decides, and hand
them to the router only while the fleet has headroom, so ordering is decided late, on fresh
state (DESIGN.md §3.3).

    headroom = Σ_{fresh, healthy workers w} max(0, slots − waiting_w − sent_w) − in_flight
      waiting_w  = requests waiting on w, from its last heartbeat
      sent_w     = requests routed to w since that heartbeat (not yet in its count)
      in_flight  = requests sent to the router and not yet answered

A request leaves for good only when the router answers `routed` (the shell then acks its
JetStream message); `no_capacity` or a failed route puts it back with its original key and
pauses dispatch for `retry_backoff_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.priority_queue.policies.base import QueuePolicy
from shared import config
from shared.schemas import AdmittedRequest, Heartbeat


@dataclass
class QueueConfig:
    slots_per_worker: int = 64
    """Requests a worker may have waiting before the queue holds back more."""
    stale_after_s: float = config.STALE_AFTER_S
    retry_backoff_s: float = 0.05
    ack_wait_s: float = 30.0
    """JetStream redelivers a request this long after a queue died holding it."""


@dataclass
class _Worker:
    waiting: int
    healthy: bool
    seen_s: float
    sent: int = 0


@dataclass
class QueueCore:
    cfg: QueueConfig
    policy: QueuePolicy
    in_flight: dict[str, AdmittedRequest] = field(default_factory=dict)
    workers: dict[str, _Worker] = field(default_factory=dict)
    paused_until: float = 0.0

    def offer(self, req: AdmittedRequest, now: float) -> bool:
        """Queue a request; False if it is already here or on its way (a redelivery)."""
        if req.request_id in self.in_flight or req.request_id in self.policy:
            return False
        self.policy.push(req, now)
        return True

    def abort(self, request_id: str) -> AdmittedRequest | None:
        """Drop a waiting request; None if it is not waiting here."""
        return self.policy.remove(request_id)

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.workers[hb.worker_id] = _Worker(waiting=hb.waiting, healthy=hb.healthy and not hb.draining, seen_s=now)

    def headroom(self, now: float) -> int:
        room = 0
        for w in self.workers.values():
            if w.healthy and now - w.seen_s <= self.cfg.stale_after_s:
                room += max(0, self.cfg.slots_per_worker - w.waiting - w.sent)
        return room - len(self.in_flight)

    def dispatchable(self, now: float) -> list[AdmittedRequest]:
        """Pop what may go to the router now; each is in flight until routed / not routed."""
        if now < self.paused_until:
            return []
        out = []
        for _ in range(max(0, self.headroom(now))):
            req = self.policy.pop(now)
            if req is None:
                break
            self.in_flight[req.request_id] = req
            out.append(req)
        return out

    def on_routed(self, request_id: str, worker_id: str) -> AdmittedRequest | None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.sent += 1
        return self.in_flight.pop(request_id, None)

    def on_not_routed(self, request_id: str, now: float, aborted: bool = False) -> None:
        req = self.in_flight.pop(request_id, None)
        if req is not None and not aborted:
            self.policy.push(req, now)
            self.paused_until = now + self.cfg.retry_backoff_s

    def __len__(self) -> int:
        return len(self.policy)
