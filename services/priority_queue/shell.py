"""The priority queue's shell: a durable JetStream pull consumer on LLM_QUEUE feeds the core through
one standing pull (see `_pull_loop`: each message reaches the core as soon as JetStream stores it,
not when a batched fetch returns); a dispatch loop sends what the core releases to the router
(`llm.v1.route`, request/reply) and acks a JetStream message only once the router answered
`routed`; an ask the router never answered (a timeout), or answered `unsure` (its offer to a worker
went unanswered), is asked again, and not expired meanwhile (QueueCore.on_route_lost). A crash
before that loses nothing: the unacked message is redelivered (after `ack_wait`) to whichever queue
replica runs. Messages held long are kept alive with `in_progress`. While no router answers at all
(no responders on `llm.v1.route`), dispatch pauses for a backoff that doubles with each failed
attempt, from the core's retry_backoff_s up to ROUTER_DOWN_BACKOFF_MAX_S, and resets on the first
routed request. A request that can no longer meet its TTFT deadline gets `rejected` (429) on its
reply subject and its message acked (QueueCore.expire). Every `stats_interval_s` it publishes its
QueueStats on `llm.v1.pq.state` (work waiting per class, drain rate), which admission reads for SLO
feasibility; a state the same as the last one sent (an idle queue's) is repeated only every
UNCHANGED_STATS_S (state_gate.py).

With a router in the same process (`router`: `tokenyard queue --with-router`, the default of
`tokenyard up`), the route request is a call instead of a NATS request/reply: one crossing fewer on
every request's way to its first token, and an answer that cannot be lost (no timeout; an `unsure`
answer still means a worker left the offer unanswered). That router also serves `llm.v1.route` for
the others that ask (P/D decode legs, other queues).

With admission in the same process too (`tokenyard queue --with-admission`, the default of
`tokenyard up`), admission hands each admitted request over by a call (`take`) the moment it
decides, then stores it in JetStream as before: the request is placed without waiting for JetStream
to store it and deliver it back (one crossing fewer again). Its JetStream copy, when it comes, is
recognised by id: held, to be acked once the request is routed, or acked at once if it was routed
(or ended) already — never queued a second time. Durability is JetStream's as before: what was not
yet routed when this process dies is redelivered. If the store fails, or finds the id a duplicate,
admission takes the request back (`withdraw`).

Once such a request is routed AND admission has its store's ack (`stored`: the ack carries the
copy's stream sequence), the copy is deleted by that sequence (JetStream's message delete) unless
it came here already (then it is acked): with several replicas, the copy may sit with another
replica (handed back, `TAKEN_RETRY_S`) or wait for redelivery, and if this replica then died or
went silent for PEER_SILENT_S, that replica would place it a second time. A copy stored after its
route's answer is marked so (subjects.PLACED_HEADER): should this replica die between its store
and its delete (~ms), another acks it instead of placing it again. What remains: a replica silent
for PEER_SILENT_S while a handed request still waits here unrouted (a GC pause) lets another
replica place the copy while this one, once it resumes, places its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError
from nats.micro.request import Request
from nats.micro.service import Service
from opentelemetry.trace import SpanKind
from tokenyard.services.priority_queue import intake
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.local_router import LocalRouter
from tokenyard.services.priority_queue.peer_watch import TAKEN_RETRY_S, PeerWatch
from tokenyard.services.priority_queue.policies.base import QueuePolicy
from tokenyard.services.priority_queue.seen_ids import SeenIds
from tokenyard.services.priority_queue.state_gate import StatsGate
from tokenyard.services.priority_queue.stored_copies import StoredCopies
from tokenyard.shared import codec, natsutil, schemas, subjects, telemetry
from tokenyard.shared.eager import eager_task
from tokenyard.shared.feed import ProcessFeeds
from tokenyard.shared.metrics import QueueMetrics
from tokenyard.shared.service import new_instance_id

log = telemetry.logger("queue")

ROUTE_TIMEOUT_S = 5.0
ROUTER_DOWN_BACKOFF_MAX_S = 2.0
PULL_EXPIRES_S = 1.0
"""A pull request's life: an idle queue renews it this often."""
PULL_GRACE_S = 1.0
"""A pull whose end (its 408) never came is renewed this long after it expired: a NATS
restart forgets pull requests, and so does a failover to another node."""


class QueueShell:
    kind = "queue"

    def __init__(self, cfg: QueueConfig, policy: QueuePolicy, fetch_batch: int = 256,
                 stats_interval_s: float = 0.1, router: LocalRouter | None = None,
                 feeds: ProcessFeeds | None = None):
        """`fetch_batch`: the messages one pull request may bring. `router`: a router in this
        process, asked directly (its answer cannot be lost on the way); None: ask the routers
        on `llm.v1.route`. `feeds`: the heartbeat and queue-state subscriptions of this
        process, shared with the services beside it (shared/feed.py); None: its own."""
        self.core = QueueCore(cfg, policy)
        self.feeds = feeds or ProcessFeeds()
        self.router = router
        self.instance_id = new_instance_id(self.kind)
        self.fetch_batch = fetch_batch
        self.stats_interval_s = stats_interval_s
        self.held: dict[str, Msg] = {}
        self._local: dict[str, tuple[bytes, dict[str, str]]] = {}
        """request id → (the request encoded, its trace headers) for each request admission
        handed over in this process (`take`), until its JetStream copy comes or it is routed."""
        self._stored: dict[str, int] = {}
        """request id → its stored copy's stream sequence (`stored`), for each request handed
        over here whose store admission saw acked while it still waits or is being placed: the
        copy is deleted once it is routed (`_settle`)."""
        self.copies = StoredCopies()  # deletes of stored copies by sequence (`_settle`)
        self.seen = SeenIds()  # ids had within JetStream's duplicate window: `take` leaves them to it
        self._placing: dict[str, asyncio.Future] = {}
        """request id → what `take` returned for it, until its route has an answer (or it
        waits for room, or it was taken back)."""
        self.peer_watch = PeerWatch(self.instance_id)  # whose stored copies are left to them
        self._received_ns: dict[str, int] = {}
        """request id → when its message came (only while spans are recorded: the hop profile), until
        its route's span has it or it leaves unrouted (`_settle`)."""
        self._wake = asyncio.Event()
        self._pull_seq = 0
        """The number of the pull in force; its messages and its end arrive on `<inbox>.<seq>`."""
        self._pull_left = 0
        """Messages the pull in force may still bring."""
        self._pull_over = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._routes: set[asyncio.Task] = set()
        self._route_context = contextvars.copy_context()  # (start's, once started)
        self._running = False
        self.router_down_backoff_s = 0.0
        """The current pause while no router answers; 0 while routers do."""
        self.route_failures = 0
        self.metrics = QueueMetrics(lambda: self.core.stats(self.instance_id, time.time()))

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = self.copies.nc = nc
        # the context every route task starts from: `take` runs inside admission's span for one
        # request, and a route it starts for another must not carry that request's trace
        self._route_context = contextvars.copy_context()
        await natsutil.ensure_queue_stream(nc)
        js = nc.jetstream()
        cfg = self.core.cfg
        try:
            await js.consumer_info(subjects.QUEUE_STREAM, subjects.QUEUE_CONSUMER)
        except NotFoundError:
            await js.add_consumer(subjects.QUEUE_STREAM, ConsumerConfig(
                durable_name=subjects.QUEUE_CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=cfg.ack_wait_s,
                max_ack_pending=-1))
        self._pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{subjects.QUEUE_STREAM}.{subjects.QUEUE_CONSUMER}"
        self._pull_inbox = nc.new_inbox()
        self._pull_sub = await nc.subscribe(f"{self._pull_inbox}.*", cb=self._on_pulled)
        await self.feeds.heartbeats.join(nc, self.on_heartbeat)
        await nc.subscribe(subjects.ABORT, cb=self.on_abort)
        await self.feeds.queue_states.join(nc, self.on_peer_state)
        await service.add_endpoint(name="stats", subject=subjects.QUEUE_STATS, handler=self._on_stats)
        self._running = True
        self._tasks = [
            asyncio.create_task(self._pull_loop()),
            asyncio.create_task(self._dispatch_loop()),
            asyncio.create_task(self._keepalive_loop()),
            asyncio.create_task(self._stats_loop()),
            asyncio.create_task(self._deadline_loop()),
        ]

    async def stop(self) -> None:
        self._running = False
        await self.feeds.heartbeats.leave(self.on_heartbeat)
        await self.feeds.queue_states.leave(self.on_peer_state)
        self._wake.set()
        self._pull_over.set()
        with contextlib.suppress(Exception):
            await self._pull_sub.unsubscribe()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._routes:  # let routes in flight finish, so their acks go out
            await asyncio.gather(*self._routes, return_exceptions=True)
        await self.copies.close()
        # Hand back what was never routed: a standby replica gets it at once. (After a crash
        # instead, JetStream redelivers the unacked messages once ack_wait has passed.)
        for msg in self.held.values():
            with contextlib.suppress(Exception):
                await msg.nak()
        self.held.clear()

    async def _pull_loop(self) -> None:
        """One standing pull request at a time: `fetch_batch` messages, for PULL_EXPIRES_S.
        JetStream delivers each message to `_on_pulled` the moment it is stored (a batched
        fetch would hold the first until the batch filled or the pull ended). A pull ends
        when its batch has all come, or with its 408 at expiry; then the next goes out. Each
        pull's end (a status message) comes on that pull's own reply subject, so a late end of
        an old pull does not end the one in force."""
        while self._running:
            self._pull_seq += 1
            self._pull_left = self.fetch_batch
            self._pull_over.clear()
            request = msgspec.json.encode({"batch": self.fetch_batch, "expires": int(PULL_EXPIRES_S * 1e9)})
            try:
                await self.nc.publish(self._pull_subject, request, reply=f"{self._pull_inbox}.{self._pull_seq}")
            except Exception as e:  # connection hiccup: back off and retry
                log.warning("pull_failed", error=repr(e))
                await asyncio.sleep(0.2)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PULL_EXPIRES_S + PULL_GRACE_S):
                    await self._pull_over.wait()

    async def _on_pulled(self, msg: Msg) -> None:
        if not msg.reply:  # a status: 408 (the pull expired), 409 (ended by the server), 100 (heartbeat)
            status = (msg.headers or {}).get("Status", "")
            if msg.subject.endswith(f".{self._pull_seq}") and status != "100":
                self._pull_over.set()
            return
        # A message (it carries its own subject, not the pull's): the pull in force brought it.
        self._pull_left -= 1
        if self._pull_left <= 0:
            self._pull_over.set()
        req, why = intake.check(msg.data)
        if req is None or why is not None:
            await intake.refuse(self.nc, msg, req, why)
            return
        taker = (msg.headers or {}).get(subjects.TAKEN_BY_HEADER)
        handed = self._local.pop(req.request_id, None) is not None
        self._stored.pop(req.request_id, None)
        if handed or taker == self.instance_id:  # handed over here (`take`): never queued a second time
            self.copies.came(msg)  # acked here: its store's ack, if later, deletes nothing
            if req.request_id in self.core.in_flight or req.request_id in self.core.policy:
                self.held[req.request_id] = msg  # acked once routed, as any other
            else:  # routed or ended before its copy came (or while its delete was on its way)
                await msg.ack()
            return
        if subjects.PLACED_HEADER in (msg.headers or {}):  # on a worker already, its delete on its way or lost
            await msg.ack()  # with its taker: it is never placed a second time
            return
        if self.peer_watch.leave_to_taker(taker, natsutil.reconnected_at(self.nc), time.time()):
            await msg.nak(delay=TAKEN_RETRY_S)  # the replica admission handed it to places it (and acks it)
            return
        self.seen.check(req.request_id, time.time())
        self.held[req.request_id] = msg  # a redelivery replaces the older delivery
        if telemetry.recording():
            self._received_ns[req.request_id] = time.time_ns()
        self.core.offer(req, time.time())
        self._wake.set()

    def take(self, req: schemas.AdmittedRequest, data: bytes, headers: dict[str, str]) -> asyncio.Future | None:
        """An admitted request from admission in this process, before JetStream stores it (the
        caller stores it there once the returned future is done (True: routed; `_placed`): when its route has an
        answer — with the router in this process, the worker's, which comes with the first
        token — or it waits for room; admission bounds the wait, PLACING_WAIT_S). `data`: `req`
        encoded as it will be stored; `headers`: its trace context. None: a request of this id
        was here within JetStream's duplicate window (a reused id: the JetStream copy alone
        decides, and its duplicate check answers)."""
        rid = req.request_id
        now = time.time()
        if rid in self._local or rid in self.held or self.seen.check(rid, now) or not self.core.offer(req, now):
            return None
        self._local[rid] = (data, headers)
        placing = self._placing[rid] = asyncio.get_running_loop().create_future()
        if telemetry.recording():
            self._received_ns[rid] = time.time_ns()
        due = self.core.next_expiry()
        if due is None or due >= now:  # nothing to reject first: release in this turn, so with room its
            self._release(now)  # route runs up to its offer inside this call, not after the dispatch loop's turn
        self._wake.set()  # the loop does the rest (expiry; a request that waits for room is stored at once)
        return placing

    def kept(self) -> dict[str, int]:
        """What this replica keeps for requests, counted (the stats endpoint's `kept`): handed over
        here and not yet stored (`local`), stored copies to delete once routed (`stored`), `take`
        futures not yet done (`placing`), routes being asked (`routes`), JetStream messages held
        (`held`). All 0 once every request here is routed or ended."""
        return {"local": len(self._local), "stored": len(self._stored), "placing": len(self._placing),
                "routes": len(self._routes), "held": len(self.held), "waiting": len(self.core),
                "in_flight": len(self.core.in_flight), "received_ns": len(self._received_ns)}

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        """The ids had within JetStream's duplicate window (SeenIds: its window and count bound)."""
        return {"seen_ids": (len(self.seen), self.seen.remembered)}

    def stored(self, request_id: str, seq: int) -> None:
        """Admission's store of a request it handed over (`take`) was acked: `seq` is its copy's
        stream sequence. Routed (or ended) already: the copy is deleted now; else once routed."""
        if request_id in self.core.in_flight or request_id in self.core.policy:
            if request_id in self._local:  # its copy has not come here yet
                self._stored[request_id] = seq
        else:
            self.copies.delete(seq)

    def _settle(self, request_id: str) -> asyncio.Future | None:
        """A request leaves this queue (routed, or ended): its stored copy goes — acked if it came
        here (returned: the ack to await), else deleted by its sequence if its store's ack came
        (else when it comes: `stored`). Its arrival time goes too (expired or aborted: no route took it)."""
        self._local.pop(request_id, None)
        self._received_ns.pop(request_id, None)
        seq = self._stored.pop(request_id, None)
        msg = self.held.pop(request_id, None)
        if msg is not None:
            return asyncio.ensure_future(msg.ack())
        if seq is not None:
            self.copies.delete(seq)
        return None

    def _release(self, now: float) -> None:
        """Start a route per released request, run up to its offer in this turn (shared/eager.py)."""
        for req in self.core.dispatchable(now):
            task = eager_task(self._route(req), context=self._route_context.copy())
            self._routes.add(task)
            task.add_done_callback(self._routes.discard)

    def _placed(self, request_id: str, routed: bool = False) -> None:
        """`take`'s future is done: True, routed onto a worker (its copy is marked placed; its first
        token may be on its way: the store lets it by); False, anything else (stored at once)."""
        placing = self._placing.pop(request_id, None)
        if placing is not None and not placing.done():
            placing.set_result(routed)

    def withdraw(self, request_id: str) -> bool:
        """Admission takes back a request it handed over (`take`) whose JetStream store failed
        or found a duplicate id. True: it was still waiting, and nothing of it ran; False: it
        is on its way to a worker, or there already (admission aborts it there). One whose
        route is still being asked is marked (QueueCore.stop): should the router place it
        nowhere, it leaves instead of waiting here again for a worker's room."""
        self._local.pop(request_id, None)
        self._stored.pop(request_id, None)
        self._received_ns.pop(request_id, None)
        self._placed(request_id)
        if self.core.abort(request_id) is not None:
            return True
        self.core.stop(request_id, ended=True)
        return False

    async def _dispatch_loop(self) -> None:
        while self._running:
            await self._wake.wait()
            self._wake.clear()
            now = time.time()
            for req, rejected in self.core.expire(now):
                await self._finish_rejected(req, rejected)
            self._release(now)
            for rid in [rid for rid in self._placing if rid not in self.core.in_flight]:
                self._placed(rid)  # waits for room (or was taken out): stored without waiting for it
            if (len(self.core) or self.core.unsure) and self.core.paused_until > now:
                asyncio.get_running_loop().call_later(self.core.paused_until - now, self._wake.set)

    async def _route(self, req: schemas.AdmittedRequest) -> None:
        msg = self.held.get(req.request_id)
        local = self._local.get(req.request_id) if msg is None else None  # handed over, not stored yet
        headers = msg.headers if msg else local[1] if local else None
        decision: schemas.RouteDecision | None = None
        unanswered = False
        with telemetry.span(
            self.kind, "process", subjects.QUEUE, headers, request_id=req.request_id,
            attributes={"tokenyard.priority": req.priority},
        ) as span:
            if (received_ns := self._received_ns.pop(req.request_id, None)) is not None:
                span.set_attribute("tokenyard.received_ns", received_ns)
            try:
                with telemetry.span(self.kind, "send", subjects.ROUTE, kind=SpanKind.PRODUCER, request_id=req.request_id):
                    # The message as JetStream holds it: the queue changes nothing in a request.
                    data = msg.data if msg is not None else local[0] if local else codec.encode(req)
                    only = self.core.placed_on.get(req.request_id)
                    if self.router is not None:  # in this process: no crossing, no encoding
                        # A handed-over request's store waits for the route's answer (_placed
                        # below): the store, `accepted` and JetStream's work then run after the
                        # worker's answer, which leaves with the first token, not beside it.
                        decision = await self.router.route(req, data, only=only)
                    else:
                        self._placed(req.request_id)  # the ask leaves first; not "routed" (no placed mark) yet
                        extra = {subjects.ROUTE_ONLY_HEADER: ",".join(sorted(only))} if only is not None else None
                        reply = await self.nc.request(subjects.ROUTE, data, timeout=ROUTE_TIMEOUT_S,
                                                      headers=telemetry.inject(extra) or None)
                if decision is None:
                    decision = codec.decode(reply.data, schemas.RouteDecision)
            except NoRespondersError:
                self._router_down()
            except (TimeoutError, NatsTimeout) as e:  # asked, not answered: it may be placed
                unanswered = True
                self.route_failures += 1
                log.warning("route_unanswered", request_id=req.request_id, error=repr(e))
            except (msgspec.DecodeError, Exception) as e:
                self.route_failures += 1
                log.warning("route_failed", request_id=req.request_id, error=repr(e))
            outcome = decision.outcome if decision else schemas.Outcome.FAILED
            span.set_attribute("tokenyard.outcome", outcome)
        self._placed(req.request_id, decision is not None and decision.outcome == schemas.Outcome.ROUTED)  # or no room
        if decision is not None:
            self.router_down_backoff_s = 0.0
        self.metrics.observe_dispatch(outcome, req.priority, time.time() - req.arrival_s)
        if decision is not None and decision.outcome == schemas.Outcome.ROUTED:
            self.core.on_routed(req.request_id, decision.worker_id, time.time())
            if (acked := self._settle(req.request_id)) is not None:
                await acked
        elif decision is not None and decision.outcome == schemas.Outcome.ABORTED:
            ended = self.core.stopping.get(req.request_id, False)  # admission ended its stream already
            self.core.on_not_routed(req.request_id, time.time(), aborted=True)
            await self._finish_aborted(req, ended)
        elif unanswered or (decision is not None and decision.unsure):  # a worker may hold it
            self.core.on_route_lost(req.request_id, time.time())
        else:
            now = time.time()
            ended = self.core.stopping.get(req.request_id, False)
            if (stopped := self.core.on_not_routed(req.request_id, now)) is not None:
                await self._finish_aborted(stopped, ended)  # an abort reached it on its way: not back in line
            elif self.router_down_backoff_s:
                self.core.paused_until = max(self.core.paused_until, now + self.router_down_backoff_s)
        self._wake.set()

    def _router_down(self) -> None:
        self.route_failures += 1
        if self.router_down_backoff_s == 0.0:
            log.warning("no_router", retry_in_s=self.core.cfg.retry_backoff_s)
        self.router_down_backoff_s = min(
            ROUTER_DOWN_BACKOFF_MAX_S, max(self.core.cfg.retry_backoff_s, 2 * self.router_down_backoff_s)
        )

    @property
    def peers(self) -> dict[str, float]:
        """The other queue replicas heard on `llm.v1.pq.state` → when last (a copy)."""
        return dict(self.peer_watch.heard)

    def on_peer_state(self, stats: schemas.QueueStats, now: float) -> None:
        self.peer_watch.on_state(stats.instance_id, now)

    def on_heartbeat(self, hb: schemas.Heartbeat, now: float) -> None:
        self.core.on_heartbeat(hb, now)
        if len(self.core):
            self._wake.set()

    async def on_abort(self, msg: Msg) -> None:
        """`llm.v1.abort`'s handler (public: the seam tests wrap to await an abort heard)."""
        try:
            abort = codec.decode(msg.data, schemas.Abort, json=codec.is_json(msg.headers))
        except codec.DecodeError:
            return
        if abort.reply_to and abort.reason == "duplicate_request_id":  # admission's 409 for a reused id
            self.core.stop(abort.request_id, abort.reply_to, ended=True)  # (withdraw took a waiting one)
            return
        req = self.core.abort(abort.request_id)  # a client's (one generation, if reply_to names it)
        if req is not None and abort.reply_to and req.reply_to != abort.reply_to:
            self.core.offer(req, time.time())  # another generation's: it stays in line
        elif req is not None:
            await self._finish_aborted(req)
        elif abort.reason != schemas.MIGRATED:  # the fence is for a request on a worker, not one asked about
            self.core.stop(abort.request_id, abort.reply_to)  # on its way: ended if placed nowhere

    async def _finish_rejected(self, req: schemas.AdmittedRequest, rejected: schemas.Rejected) -> None:
        """A request that can no longer meet its deadline: its stream ends with `rejected`
        (the edge answers 429), its message is acked (it is not redelivered)."""
        log.info("deadline_exceeded", request_id=req.request_id, waited_s=time.time() - req.arrival_s)
        self.metrics.observe_dispatch(schemas.Outcome.REJECTED_DEADLINE, req.priority, time.time() - req.arrival_s)
        if (acked := self._settle(req.request_id)) is not None:
            await acked
        await self.nc.publish(req.reply_to, codec.encode(rejected, json=req.json), headers=codec.content_headers(req.json))

    async def _deadline_loop(self) -> None:
        """Wake the dispatch loop at the next deadline, so a quiet fleet still rejects on time."""
        while self._running:
            due = self.core.next_expiry()
            delay = due - time.time() if due is not None else 0.5
            await asyncio.sleep(min(0.5, max(0.01, delay)))
            due = self.core.next_expiry()
            if due is not None and due <= time.time():
                self._wake.set()

    async def _finish_aborted(self, req: schemas.AdmittedRequest, ended: bool = False) -> None:
        """An aborted request that never reached a worker: end its stream here (unless it `ended`
        already: admission answered it), drop its message."""
        if ended:  # a withdrawn generation: its store failed or was a reused id's duplicate, so
            return  # no stored copy of it exists (one held under its id is another generation's)
        if (acked := self._settle(req.request_id)) is not None:
            await acked
        usage = schemas.Usage(prompt_tokens=req.prompt_len, completion_tokens=0, total_tokens=req.prompt_len)
        done = schemas.Finished(request_id=req.request_id, seq=0, finish_reason="abort", usage=usage)
        await self.nc.publish(req.reply_to, codec.encode(done, json=req.json), headers=codec.content_headers(req.json))

    async def _keepalive_loop(self) -> None:
        while self._running:
            await asyncio.sleep(self.core.cfg.ack_wait_s / 3)
            for msg in list(self.held.values()):
                with contextlib.suppress(Exception):
                    await msg.in_progress()

    async def _stats_loop(self) -> None:
        gate = StatsGate()
        while self._running:
            await asyncio.sleep(self.stats_interval_s)
            now = time.time()
            stats = self.core.stats(self.instance_id, now)
            if gate.due(stats, now):
                with contextlib.suppress(Exception):
                    await self.nc.publish(subjects.QUEUE_STATE, codec.encode(stats))

    async def _on_stats(self, req: Request) -> None:
        now = time.time()
        s = self.core.stats(self.instance_id, now)
        stats = {"depth": len(self.core), "in_flight": len(self.core.in_flight), "held": len(self.held),
                 "headroom": self.core.headroom(now), "policy": self.core.policy.name,
                 "depth_by_class": s.depth, "work_tokens_by_class": s.work_tokens,
                 "drain_tokens_per_s": s.drain_tokens_per_s, "kept": self.kept()}
        await req.respond(msgspec.json.encode(stats))
