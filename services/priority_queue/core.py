"""The priority queue's core: hold admitted requests in the order a policy decides, and hand
them to the router only while the fleet has room, so the backlog waits here, where its order
is decided, and ordering is decided late, on fresh state (docs/ARCHITECTURE.md §5).

Flow control (on by default; llm-d's flow control and saturation detector): the queue holds
requests while the fleet is saturated, judged per fresh, healthy worker w from its last
heartbeat and what was routed to it since, with no per-deployment number:

    backlog_w  = queued_prefill_w + sent_tokens_w          prompt tokens not yet prefilled
    room_w     = min( B_w / prefill_s_per_token_w − backlog_w,   time: the backlog drains in B_w
                      kv_free_w · block_size − backlog_w )     memory: the backlog fits its KV
    B_w        = min(H, S_w)                           shared.slo.prefill_budget_s
    H          = TTFT target of the tightest class / 2  (shared.slo: 0.25 s)
    S_w        = the TPOT slack of w's tightest running decode (Heartbeat.tpot_slack_ms: the
                 delay its tokens may still take, its mean TPOT within its SLO; ∞ when nothing
                 decodes). Every step that carries a prefill chunk delays each running decode's
                 next token, so prefill beyond S_w pushes a decode past its TPOT SLO: a worker
                 whose decodes are tight takes no prefill until they gain slack or finish.
    headroom   = Σ_w max(0, room_w) − prompt tokens in flight to the router
    A worker that reports no prefill rate (vLLM's) has room while waiting_w + sent_w < 2.
    A worker in the decode phase (EcoServe's, or a spatial P/D decode worker) has none: it
    refuses every new request (only P/D decode legs, which never pass the queue, go to it), so
    room counted there would be released to the router and bounce back. An EcoServe worker in
    its prefill phase has room for one more request while waiting_w + sent_w ≤ 2 (with which
    its phase would end) and its backlog is under 1 s of prefill, its minimum phase length
    (shared.ecoserve.prefill_phase_starved).

The queue releases requests in its policy's order while headroom > 0 (each takes its prompt
tokens off it; the last one may overshoot). A placing policy (base.PlacingPolicy: bubble
placement, policies/bubble_placement.py) releases instead by the room of the workers each
request may go to, and names them (`placed_on`, which the router keeps to). H is half the tightest TTFT target, so a request
released now starts its prefill well within any class's target, and it spans 2.5 heartbeat
intervals, so an engine does not run dry between two heartbeats. With flow control off
(`flow_control=False`) a worker takes up to `slots_per_worker` waiting requests (with a batch
cap, also ≤ cap − running − waiting), counted in requests, and the backlog waits in the
engines.

P0 is served from reserved capacity (DESIGN §3.3): once the headroom is spent, a class-aware
policy may still release `p0_reserve_per_worker` P0 requests per fresh worker and heartbeat
(the engines run P0 first: vLLM's priority scheduling).

Deadlines: a request that can no longer meet its TTFT deadline (shared.slo.ttft_deadline_s:
its own `ttft_slo_ms`, else class target + own predicted prefill, no more than the class's
cap, shared.slo.deadline_cap_s; P3 has none)
leaves with a 429 `deadline_exceeded` (`expire`) — once it is past deadline − prefill − H
(shared.slo.latest_release_s), since a released request may still wait up to H in its engine
and then needs its prefill; serving it would only delay the requests behind it.

A request leaves for good only when the router answers `routed` (the shell then acks its
JetStream message); `no_capacity` or a failed route puts it back with its original key and
pauses dispatch for `retry_backoff_s`. An ask that got no answer at all (a timeout: the
router may have placed it, and only its answer was lost), or an `unsure` one (the router's
offer to a worker went unanswered: the worker may hold it), is not a refusal: the request stays
in flight, past any deadline, and is asked again before anything else is released
(`on_route_lost`): the router answers a request it placed with `routed` again, so the
second ask confirms the placement or makes it, and only a definite `no_capacity` puts the
request back in line, where `expire` may reject it. The core also keeps what admission needs for SLO
feasibility (`stats`): requests and work (prompt + max_tokens) waiting per admitted class,
and the drain rate D: the work routed out of a backlog per second the queue held one, over the
last `drain_window_s` (what the fleet absorbs while saturated; while the queue is not the
bottleneck, its routing rate is the demand, not the fleet's capacity).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from tokenyard.services.priority_queue.policies.base import (
    NUM_CLASSES,
    QueuePolicy,
    WorkerRoom,
    cost,
    deadline,
    klass,
)
from tokenyard.shared import staleness
from tokenyard.shared.ecoserve import prefill_phase_starved
from tokenyard.shared.schemas import AdmittedRequest, Heartbeat, Phase, QueueStats, Rejected
from tokenyard.shared.slo import (
    ENGINE_BACKLOG_S,
    decode_slack_s,
    latest_release_s,
    prefill_budget_s,
    request_deadline_s,
)

BACKLOG_S = ENGINE_BACKLOG_S
"""H: the prefill backlog a worker may hold, in seconds of its prefill time."""
DRAIN_MIN_SPAN_S = 0.25
"""The drain rate is never measured over less than this (one release fills H of backlog)."""
UNKNOWN_RATE_WAITING = 2
"""A worker without a prefill rate has room while fewer than this wait in it."""


@dataclass
class QueueConfig:
    flow_control: bool = True
    """Hold the backlog here while the fleet is saturated (see the module's formulas); off:
    fill each worker up to `slots_per_worker` waiting requests."""
    expire_deadlines: bool = True
    """Reject a waiting request once its TTFT deadline has passed (429 deadline_exceeded)."""
    slots_per_worker: int = 64
    """Flow control off: requests a worker may have waiting before the queue holds back more."""
    stale_after_s: float | None = None
    """None (the default): a worker is out after 10 of the heartbeat intervals it announces
    (shared.staleness, the rule admission and the router apply); a number: a fixed bound."""
    retry_backoff_s: float = 0.05
    ack_wait_s: float = 30.0
    """JetStream redelivers a request this long after a queue died holding it."""
    batch_cap_per_worker: int = 0
    """With > 0, a worker is also full once running + waiting reach it: the backlog then waits
    here, in the policy's order, rather than in the engine's first-come line."""
    p0_reserve_per_worker: int = 4
    """P0 requests per fresh worker and heartbeat the queue may release beyond the headroom."""
    drain_window_s: float = 2.0


@dataclass(slots=True)
class _Worker:
    waiting: int
    takes_new: bool
    """It would accept a new request: healthy, not draining, not in the decode phase."""
    seen_s: float
    stale_s: float
    """Silence after which it is out (shared.staleness)."""
    sent: int = 0
    running: int = 0
    queued_prefill: int = 0
    kv_free_tokens: int = 0
    prefill_s_per_token: float = 0.0
    sent_tokens: int = 0
    """Prompt tokens routed to it since its heartbeat."""
    sent_p0: int = 0
    """P0 requests released from the reserve and routed to it since its heartbeat."""
    tpot_slack_s: float | None = None
    """The prefill time its running decodes can still absorb within their TPOT SLO (the
    tightest one's saved slack); None: nothing decodes."""
    phase: str = Phase.MIXED
    mode: str = ""
    """Its macro-instance's mode (Heartbeat.mode)."""
    counted: int = 0
    """What it adds to QueueCore.room_sum: max(0, room()) while it takes new requests (flow
    control), else 0."""

    def room(self) -> int:
        """Flow control: prompt tokens it may still take (≤ 0: saturated)."""
        if self.prefill_s_per_token <= 0.0:
            return 1 if self.waiting + self.sent < UNKNOWN_RATE_WAITING else 0
        backlog = self.queued_prefill + self.sent_tokens
        room = int(min(prefill_budget_s(self.tpot_slack_s) / self.prefill_s_per_token, self.kv_free_tokens)) - backlog
        if room <= 0 and prefill_phase_starved(self.phase, self.mode, self.waiting + self.sent,
                                               backlog * self.prefill_s_per_token):
            return 1  # one more request, whatever its prompt (the last release may overshoot)
        return room


@dataclass
class QueueCore:
    cfg: QueueConfig
    policy: QueuePolicy
    in_flight: dict[str, AdmittedRequest] = field(default_factory=dict)
    workers: dict[str, _Worker] = field(default_factory=dict)
    paused_until: float = 0.0
    depth: list[int] = field(default_factory=lambda: [0] * NUM_CLASSES)
    work: list[int] = field(default_factory=lambda: [0] * NUM_CLASSES)
    routed: deque[tuple[float, int, bool]] = field(default_factory=deque)
    """(time, cost, out of a backlog) of the requests routed within the last drain_window_s."""
    backlog_since: float | None = None
    """Since when requests have been left waiting after every dispatch; None: none are."""
    backlog_spells: deque[tuple[float, float]] = field(default_factory=deque)
    """Ended (start, end) spells with a backlog, within the last drain_window_s."""
    from_reserve: set[str] = field(default_factory=set)
    """Ids of the requests in flight that the P0 reserve released."""
    seen_arrival_s: float = 0.0
    """The latest arrival among the requests offered (QueueStats.seen_arrival_s)."""
    deadlines: list[tuple[float, str]] = field(default_factory=list)
    """(latest release time, request id) of waiting requests with a deadline; lazily cleaned
    (a heap)."""
    room_sum: int = 0
    """Flow control: Σ max(0, room_w) over the workers that take new requests (their `counted`), kept as
    heartbeats and routes change a worker's room: `headroom` is this sum while every
    worker is fresh, with no pass over the fleet (integers: the same sum in any order)."""
    unsure: dict[str, None] = field(default_factory=dict)
    """Ids in flight whose route ask got no answer (on_route_lost), in the order lost: the
    next dispatch asks the router again about each."""
    placed_on: dict[str, frozenset[str]] = field(default_factory=dict)
    """Ids in flight that a placing policy released → the workers each may go to."""
    stopping: dict[str, bool] = field(default_factory=dict)
    """Ids in flight that an abort (or admission's `withdraw`) reached while their route was
    being asked → whether their stream has ended already (admission answered it 409 / 503). If
    the route does not place it, it leaves (on_not_routed returns it) instead of going back in
    line to wait for the next worker's room; placed, the abort is the worker's to apply."""
    oldest_seen_s: float = math.inf
    """A lower bound of the latest heartbeat times of the workers that take new requests (a worker's only grows;
    each heartbeat lowers the bound to its own time): while now − it ≤ the least bound, no
    such worker is stale."""
    least_stale_s: float = math.inf
    """A lower bound of those workers' `stale_s` (the same for a fleet that beats alike)."""

    def offer(self, req: AdmittedRequest, now: float) -> bool:
        """Queue a request; False if it is already here or on its way (a redelivery)."""
        if req.request_id in self.in_flight or req.request_id in self.policy:
            return False
        self.seen_arrival_s = max(self.seen_arrival_s, req.arrival_s)
        self._push(req, now)
        return True

    def _push(self, req: AdmittedRequest, now: float) -> None:
        self.policy.push(req, now)
        self.depth[klass(req)] += 1
        self.work[klass(req)] += cost(req)
        due = deadline(req, klass(req))
        if self.cfg.expire_deadlines and math.isfinite(due):
            heapq.heappush(self.deadlines, (latest_release_s(due, req.prefill_s), req.request_id))

    def next_expiry(self) -> float | None:
        """When `expire` may next take a request out (an upper bound on the wait; None: never)."""
        return self.deadlines[0][0] if self.deadlines else None

    def expire(self, now: float) -> list[tuple[AdmittedRequest, Rejected]]:
        """Take out every waiting request whose TTFT deadline has passed, each with the 429
        its client gets (Retry-After: the predicted wait of its class at the drain rate)."""
        out = []
        heap = self.deadlines
        while heap and heap[0][0] < now:
            _, rid = heapq.heappop(heap)
            req = self.policy.remove(rid)
            if req is None:  # dispatched, aborted, or an older entry of a put-back request
                continue
            self._left(req)
            c = klass(req)
            drain, _ = self.drain_rate(now)
            ahead = sum(self.work[: c + 1])
            out.append((req, Rejected(
                request_id=rid, status=429, code="deadline_exceeded",
                message=f"The request waited {now - req.arrival_s:.2f} s in the queue and can no longer "
                        f"meet its {request_deadline_s(req) - req.arrival_s:.3g} s TTFT deadline (P{c}); retry later",
                retry_after_s=ahead / drain if drain > 0 else None, queue_depth=len(self.policy),
            )))
        return out

    def _left(self, req: AdmittedRequest) -> AdmittedRequest:
        self.depth[klass(req)] -= 1
        self.work[klass(req)] -= cost(req)
        return req

    def abort(self, request_id: str) -> AdmittedRequest | None:
        """Drop a waiting request; None if it is not waiting here."""
        req = self.policy.remove(request_id)
        return None if req is None else self._left(req)

    def stop(self, request_id: str, reply_to: str = "", ended: bool = False) -> bool:
        """An abort for a request in flight (its route being asked), for the generation streaming
        to `reply_to` ('': whichever; `ended`: its stream has had its end, admission's 409): True
        if that one is in flight here (then it is marked, `stopping`); False if none is, or another
        generation of the id (a reused id's first request) is."""
        req = self.in_flight.get(request_id)
        if req is None or (reply_to and req.reply_to != reply_to):
            return False
        # a later plain abort (admission's own, after its error) does not make an ended stream unended
        self.stopping[request_id] = self.stopping.get(request_id, False) or ended
        return True

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        s = hb.stats
        w = _Worker(
            waiting=s.waiting, takes_new=hb.healthy and not hb.draining and hb.phase != Phase.DECODE,
            seen_s=now, stale_s=self._stale_s(hb), running=s.running,
            queued_prefill=s.queued_prefill_tokens, kv_free_tokens=s.kv_blocks_free * s.block_size,
            prefill_s_per_token=s.prefill_ms_per_token / 1000.0,
            tpot_slack_s=decode_slack_s(hb), phase=hb.phase, mode=hb.mode)
        old = self.workers.get(hb.worker_id)
        if old is not None:
            self.room_sum -= old.counted
        self.workers[hb.worker_id] = w
        self._count(w)
        if now < self.oldest_seen_s:
            self.oldest_seen_s = now
        if w.stale_s < self.least_stale_s:
            self.least_stale_s = w.stale_s

    def _stale_s(self, hb: Heartbeat) -> float:
        fixed = self.cfg.stale_after_s
        return staleness.stale_after_s(hb.interval_s) if fixed is None else fixed

    @staticmethod
    def _is_fresh(w: _Worker, now: float) -> bool:
        return w.takes_new and now - w.seen_s <= w.stale_s

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now`: the same as `on_heartbeat` with it,
        where nothing was routed to the worker since (else False, and nothing changes: the
        caller sends the heartbeat itself)."""
        w = self.workers.get(worker_id)
        if w is None or w.sent or w.sent_tokens or w.sent_p0:
            return False
        w.seen_s = now
        if now < self.oldest_seen_s:
            self.oldest_seen_s = now
        return True

    def _count(self, w: _Worker) -> None:
        """Recount what `w` adds to room_sum (its heartbeat or a route changed its room)."""
        counted = 0
        if w.takes_new and self.cfg.flow_control:
            r = w.room()
            if r > 0:
                counted = r
        self.room_sum += counted - w.counted
        w.counted = counted

    def _fresh(self, now: float) -> list[_Worker]:
        return [w for w in self.workers.values() if self._is_fresh(w, now)]

    def _size(self, req: AdmittedRequest) -> int:
        """What a request takes off the headroom: its prompt tokens (flow control), else 1."""
        return max(1, req.prompt_len) if self.cfg.flow_control else 1

    def headroom(self, now: float) -> int:
        """Flow control: prompt tokens the fleet may still take; off: requests."""
        if self.cfg.flow_control:  # no pass over the fleet while every worker that takes new requests is fresh
            if now - self.oldest_seen_s > self.least_stale_s:  # some may be stale: the bounds, exact again
                takers = [w for w in self.workers.values() if w.takes_new]
                self.oldest_seen_s = min((w.seen_s for w in takers), default=math.inf)
                self.least_stale_s = min((w.stale_s for w in takers), default=math.inf)
            if now - self.oldest_seen_s <= self.least_stale_s:
                room = self.room_sum
            else:
                room = sum(w.counted for w in self.workers.values() if self._is_fresh(w, now))
            return room - sum(self._size(r) for r in self.in_flight.values())
        fresh = self._fresh(now)
        cap = self.cfg.batch_cap_per_worker
        room = 0
        for w in fresh:
            free = self.cfg.slots_per_worker - w.waiting
            if cap > 0:
                free = min(free, cap - w.running - w.waiting)
            room += max(0, free - w.sent)
        return room - len(self.in_flight)

    def saturated(self, now: float) -> bool:
        return self.headroom(now) <= 0

    def dispatchable(self, now: float) -> list[AdmittedRequest]:
        """Pop what may go to the router now; each is in flight until routed / not routed."""
        if now < self.paused_until:
            return []
        # asked again first: they hold their place in flight (and their share of the headroom)
        out = [self.in_flight[rid] for rid in self.unsure if rid in self.in_flight]
        self.unsure.clear()
        release = getattr(self.policy, "release", None)  # a PlacingPolicy (base.py)
        if release is not None and self.cfg.flow_control and len(self.policy):
            rooms = {wid: WorkerRoom(w.room(), w.queued_prefill + w.sent_tokens) for wid, w in self.workers.items()
                     if self._is_fresh(w, now)}
            for req, workers in release(rooms, self.in_flight, self._size, now):
                self._send(req, out)
                self.placed_on[req.request_id] = workers
            room = 0
        else:
            room = self.headroom(now) if len(self.policy) else 0  # nothing waits: no sum over the fleet
        while room > 0:
            req = self.policy.pop(now)
            if req is None:
                break
            self._send(req, out)
            room -= self._size(req)
        pop_realtime = getattr(self.policy, "pop_realtime", None)
        if pop_realtime is not None and self.cfg.p0_reserve_per_worker > 0 and len(self.policy):
            fresh = self._fresh(now)
            reserve = sum(max(0, self.cfg.p0_reserve_per_worker - w.sent_p0) for w in fresh)
            for _ in range(max(0, reserve - len(self.from_reserve))):
                req = pop_realtime(now)
                if req is None:
                    break
                self._send(req, out)
                self.from_reserve.add(req.request_id)
        if len(self.policy) and self.backlog_since is None:
            self.backlog_since = now
        elif not len(self.policy) and self.backlog_since is not None:
            self.backlog_spells.append((self.backlog_since, now))
            self.backlog_since = None
        return out

    def _send(self, req: AdmittedRequest, out: list[AdmittedRequest]) -> None:
        self._left(req)
        self.in_flight[req.request_id] = req
        out.append(req)

    def on_routed(self, request_id: str, worker_id: str, now: float | None = None) -> AdmittedRequest | None:
        w = self.workers.get(worker_id)
        req = self.in_flight.pop(request_id, None)
        self.unsure.pop(request_id, None)
        self.stopping.pop(request_id, None)
        self.placed_on.pop(request_id, None)
        if w is not None:
            w.sent += 1
            if req is not None:
                w.sent_tokens += req.prompt_len
            self._count(w)
        if request_id in self.from_reserve:
            self.from_reserve.discard(request_id)
            if w is not None:
                w.sent_p0 += 1
        if req is not None and now is not None:
            self.routed.append((now, cost(req), self.backlog_since is not None))
        return req

    def on_route_lost(self, request_id: str, now: float) -> None:
        """The router's answer never came (a timeout): the request may be on a worker, so it
        neither goes back in line nor expires; it stays in flight and the next dispatch (after
        `retry_backoff_s`) returns it again, to ask the router once more."""
        if request_id in self.in_flight:
            self.unsure[request_id] = None
            self.paused_until = now + self.cfg.retry_backoff_s

    def on_not_routed(self, request_id: str, now: float, aborted: bool = False) -> AdmittedRequest | None:
        """The route placed it nowhere: back in line, unless `aborted` (the router heard the
        abort) or an abort reached it in flight (`stop`): then it leaves, and is returned (its
        stream is the caller's to end)."""
        self.from_reserve.discard(request_id)
        req = self.in_flight.pop(request_id, None)
        self.unsure.pop(request_id, None)
        self.placed_on.pop(request_id, None)
        stopped = self.stopping.pop(request_id, None) is not None
        if req is None or aborted:
            return None
        if stopped:
            return req
        self._push(req, now)
        self.paused_until = now + self.cfg.retry_backoff_s
        return None

    def drain_rate(self, now: float) -> tuple[float, float]:
        """(work, requests) per second over the last drain_window_s: routed out of a backlog
        per second of backlog, once the window holds DRAIN_MIN_SPAN_S of backlog; before that,
        (0, 0), nothing measured. What left with nothing waiting behind it was the demand, not
        what the fleet can take: a trickle's rate read as the drain made admission predict a
        wait of minutes for a burst that the idle fleet then served in 0.3 s, and refuse it
        (admission prices a burst with no measured drain by what the workers sustain)."""
        tokens, requests, _ = self._drain(now)
        return tokens, requests

    def _drain(self, now: float) -> tuple[float, float, bool]:
        """`drain_rate`'s (work, requests) per second, and whether they were measured (the window
        held DRAIN_MIN_SPAN_S of backlog: a measured 0 is a stall, not an unmeasured drain)."""
        held = self.backlog_held_s(now)
        if held < DRAIN_MIN_SPAN_S:
            return 0.0, 0.0, False
        out = [c for _, c, backlog in self.routed if backlog]
        return sum(out) / held, len(out) / held, True

    def backlog_held_s(self, now: float) -> float:
        """Seconds of the last drain_window_s during which requests waited here (what is older
        leaves the window's records)."""
        start = now - self.cfg.drain_window_s
        while self.routed and self.routed[0][0] <= start:
            self.routed.popleft()
        while self.backlog_spells and self.backlog_spells[0][1] <= start:
            self.backlog_spells.popleft()
        spells = [*self.backlog_spells, *([(self.backlog_since, now)] if self.backlog_since is not None else [])]
        return sum(end - max(begin, start) for begin, end in spells)

    def stats(self, instance_id: str, now: float) -> QueueStats:
        tokens, requests, measured = self._drain(now)
        return QueueStats(
            instance_id=instance_id, ts=now, policy=self.policy.name, depth=list(self.depth),
            work_tokens=list(self.work), in_flight=len(self.in_flight),
            drain_tokens_per_s=tokens, drain_requests_per_s=requests,
            drain_measured=measured,
            headroom=max(0, self.headroom(now)) if now >= self.paused_until else 0,
            seen_arrival_s=self.seen_arrival_s, flow_control=self.cfg.flow_control,
        )

    def __len__(self) -> int:
        return len(self.policy)
