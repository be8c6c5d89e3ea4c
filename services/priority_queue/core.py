"""The priority queue's core: hold admitted requests in the order a policy decides, and hand
them to the router only while the fleet has headroom, so ordering is decided late, on fresh
state (DESIGN.md §3.3).

    headroom = Σ_{fresh, healthy workers w} max(0, room_w − sent_w) − in_flight
      room_w     = slots − waiting_w, and with a batch cap also ≤ cap − running_w − waiting_w
      waiting_w  = requests waiting on w, from its last heartbeat; running_w likewise
      sent_w     = requests routed to w since that heartbeat (not yet in its count)
      in_flight  = requests sent to the router and not yet answered

A request leaves for good only when the router answers `routed` (the shell then acks its
JetStream message); `no_capacity` or a failed route puts it back with its original key and
pauses dispatch for `retry_backoff_s`.

P0 is served from reserved capacity (DESIGN §3.3): once the headroom is spent, a class-aware
policy may still release P0 requests into `p0_reserve_per_worker` more slots per fresh
worker. The core also keeps what admission needs for SLO feasibility (`stats`): requests and
work (prompt + max_tokens) waiting per admitted class, and the drain rate, work routed per
second over the last `drain_window_s`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tokenyard.services.priority_queue.policies.base import NUM_CLASSES, QueuePolicy, cost, klass
from tokenyard.shared import config
from tokenyard.shared.schemas import AdmittedRequest, Heartbeat, QueueStats


@dataclass
class QueueConfig:
    slots_per_worker: int = 64
    """Requests a worker may have waiting before the queue holds back more."""
    stale_after_s: float = config.STALE_AFTER_S
    retry_backoff_s: float = 0.05
    ack_wait_s: float = 30.0
    """JetStream redelivers a request this long after a queue died holding it."""
    batch_cap_per_worker: int = 0
    """With > 0, a worker is also full once running + waiting reach it: the backlog then waits
    here, in the policy's order, rather than in the engine's first-come line."""
    p0_reserve_per_worker: int = 0
    """Slots per fresh worker beyond `slots_per_worker` that only P0 may take."""
    drain_window_s: float = 5.0


@dataclass
class _Worker:
    waiting: int
    healthy: bool
    seen_s: float
    sent: int = 0
    running: int = 0


@dataclass
class QueueCore:
    cfg: QueueConfig
    policy: QueuePolicy
    in_flight: dict[str, AdmittedRequest] = field(default_factory=dict)
    workers: dict[str, _Worker] = field(default_factory=dict)
    paused_until: float = 0.0
    depth: list[int] = field(default_factory=lambda: [0] * NUM_CLASSES)
    work: list[int] = field(default_factory=lambda: [0] * NUM_CLASSES)
    routed: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, cost) of the requests routed within the last drain_window_s."""
    routed_work: int = 0

    def offer(self, req: AdmittedRequest, now: float) -> bool:
        """Queue a request; False if it is already here or on its way (a redelivery)."""
        if req.request_id in self.in_flight or req.request_id in self.policy:
            return False
        self._push(req, now)
        return True

    def _push(self, req: AdmittedRequest, now: float) -> None:
        self.policy.push(req, now)
        self.depth[klass(req)] += 1
        self.work[klass(req)] += cost(req)

    def _left(self, req: AdmittedRequest) -> AdmittedRequest:
        self.depth[klass(req)] -= 1
        self.work[klass(req)] -= cost(req)
        return req

    def abort(self, request_id: str) -> AdmittedRequest | None:
        """Drop a waiting request; None if it is not waiting here."""
        req = self.policy.remove(request_id)
        return None if req is None else self._left(req)

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.workers[hb.worker_id] = _Worker(
            waiting=hb.waiting, healthy=hb.healthy and not hb.draining, seen_s=now, running=hb.running)

    def _fresh(self, now: float) -> list[_Worker]:
        return [w for w in self.workers.values() if w.healthy and now - w.seen_s <= self.cfg.stale_after_s]

    def headroom(self, now: float) -> int:
        cap = self.cfg.batch_cap_per_worker
        room = 0
        for w in self._fresh(now):
            free = self.cfg.slots_per_worker - w.waiting
            if cap > 0:
                free = min(free, cap - w.running - w.waiting)
            room += max(0, free - w.sent)
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
            self._send(req, out)
        pop_realtime = getattr(self.policy, "pop_realtime", None)
        if pop_realtime is not None and self.cfg.p0_reserve_per_worker > 0:
            reserve = self.cfg.p0_reserve_per_worker * len(self._fresh(now))
            for _ in range(max(0, min(reserve, self.headroom(now) + reserve))):
                req = pop_realtime(now)
                if req is None:
                    break
                self._send(req, out)
        return out

    def _send(self, req: AdmittedRequest, out: list[AdmittedRequest]) -> None:
        self._left(req)
        self.in_flight[req.request_id] = req
        out.append(req)

    def on_routed(self, request_id: str, worker_id: str, now: float | None = None) -> AdmittedRequest | None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.sent += 1
        req = self.in_flight.pop(request_id, None)
        if req is not None and now is not None:
            self.routed.append((now, cost(req)))
            self.routed_work += cost(req)
        return req

    def on_not_routed(self, request_id: str, now: float, aborted: bool = False) -> None:
        req = self.in_flight.pop(request_id, None)
        if req is not None and not aborted:
            self._push(req, now)
            self.paused_until = now + self.cfg.retry_backoff_s

    def drain_rate(self, now: float) -> tuple[float, float]:
        """(work, requests) routed per second over the last drain_window_s."""
        window = self.cfg.drain_window_s
        while self.routed and self.routed[0][0] <= now - window:
            self.routed_work -= self.routed.popleft()[1]
        return self.routed_work / window, len(self.routed) / window

    def stats(self, instance_id: str, now: float) -> QueueStats:
        tokens, requests = self.drain_rate(now)
        return QueueStats(
            instance_id=instance_id, ts=now, policy=self.policy.name, depth=list(self.depth),
            work_tokens=list(self.work), in_flight=len(self.in_flight),
            drain_tokens_per_s=tokens, drain_requests_per_s=requests, headroom=max(0, self.headroom(now)),
        )

    def __len__(self) -> int:
        return len(self.policy)
