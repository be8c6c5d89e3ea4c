"""The router's shell: a `nats.micro` endpoint on `llm.v1.route` (queue group `router`: each
replica keeps its own fleet view and KV block index from the fan-out subjects — heartbeats,
KV events `llm.v1.kv.<id>`, macro states — and takes a share of the decisions). For each request: the core picks a worker, the shell offers the request to it
(`llm.v1.worker.<id>.generate`, request/reply); on a refusal or a timeout it asks the core
again without that worker, up to `max_attempts`, then answers `no_capacity`.

A route request is idempotent per request (its id and reply subject): a queue asks again
when the answer to its first ask was lost (a timeout; the request may be on a worker), and
JetStream redelivers what a dead queue held. The same request asked while its placement
runs gets that placement's decision; asked after it was routed, `routed` to the same worker
again, with no second offer (another worker would take it: two generations on one stream).

Migration (services/router/migration.py decides; services/router/effects.py performs): the replica that
placed a request subscribes to its reply subject and follows its chunks; every `tick_s` it
asks the migration core what to do — probe a worker (`llm.v1.worker.<id>.status`), re-issue
a dead worker's request elsewhere (after fencing it: `llm.v1.fence`), end a request
with an error, or abort an orphan whose client's lease lapsed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.micro.request import Request
from nats.micro.service import Service
from opentelemetry.trace import SpanKind
from tokenyard.services.router import effects
from tokenyard.services.router.adopt import on_adopt, on_adopted_ask
from tokenyard.services.router.bounds import check_inputs
from tokenyard.services.router.core import ROUTE_ATTEMPTS, Placement, RouterConfig, RouterCore
from tokenyard.services.router.follow import Follows
from tokenyard.services.router.migration import (
    MigrationConfig,
    MigrationCore,
)
from tokenyard.services.router.reask import Answer, ReaskMemory, Wait, key_of
from tokenyard.shared import codec, nats_internals, natsutil, schemas, subjects, telemetry
from tokenyard.shared.eager import eager_task
from tokenyard.shared.feed import ProcessFeeds
from tokenyard.shared.metrics import RouterMetrics
from tokenyard.shared.schemas import MIGRATED
from tokenyard.shared.service import new_instance_id
from tokenyard.shared.slo import OfferPrefill

log = telemetry.logger("router")

OFFER_TIMEOUT_S = 2.0


class RouterShell:
    kind = "router"

    def __init__(self, cfg: RouterConfig, max_attempts: int = ROUTE_ATTEMPTS,
                 migration: MigrationConfig | None = None, tick_s: float = 0.1,
                 feeds: ProcessFeeds | None = None):
        """`feeds`: the heartbeat subscription of this process, shared with the services beside
        it (shared/feed.py); None: its own."""
        self.core = RouterCore(cfg)
        self.feeds = feeds or ProcessFeeds()
        self.migration = MigrationCore(migration)
        self.instance_id = new_instance_id(self.kind)
        self.max_attempts = max_attempts
        self.tick_s = tick_s
        self.metrics = RouterMetrics(cfg.policy, fleet=self._fresh_rows)
        self._inflight: set[asyncio.Task] = set()
        self.follows = Follows()
        """The streams migration follows, by request id (services/router/follow.py); a queue
        process with an edge sets `follows.local` to the edge's client, whose streams it taps."""
        self.reask: ReaskMemory[asyncio.Future] = ReaskMemory()
        """Placed, placing and unanswered requests: a route request asked again (services/router/reask.py)."""
        self._housekeeping: asyncio.Task | None = None
        self._monitor: asyncio.Task | None = None
        self._tracking = asyncio.Event()
        """Set when a stream is tracked: wakes the monitor loop from its idle wait."""
        self.adoptions: dict[str, asyncio.Event] = {}
        """request id → the event set when its adoption under way here ends (services/router/adopt.py)."""

    def kept(self) -> dict[str, int]:
        """Per-request state here, counted (shared/service.py): 0 once its requests ended."""
        return {"inflight": len(self._inflight), "adoptions": len(self.adoptions), "follows": len(list(self.follows)),
                "placing": len(self.reask.placing), "offers_out": sum(map(len, self.core.unanswered.values())),
                **self.migration.kept()}

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        r = self.reask
        return {"placed": (len(r.placed), r.capacity), "unanswered": (len(r.unanswered), r.capacity),
                **self.migration.remembered()}

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = self.follows.nc = nc
        await self.feeds.heartbeats.join(nc, self.on_heartbeat)
        await nc.subscribe(subjects.MACRO_STATE_ALL, cb=self._on_macro_state)
        await nc.subscribe(subjects.KV_EVENTS_ALL, cb=self._on_kv_events)
        await nc.subscribe(subjects.LEASE_ALL, cb=self._on_lease)
        await nc.subscribe(subjects.ABORT, cb=self._on_abort)
        await nc.subscribe(subjects.ADOPT, queue=subjects.GROUP_ROUTER, cb=functools.partial(on_adopt, self))
        await nc.subscribe(subjects.router_adopted(self.instance_id), cb=functools.partial(on_adopted_ask, self))
        await service.add_endpoint(
            name="route", subject=subjects.ROUTE, queue_group=subjects.GROUP_ROUTER, handler=self._on_route
        )
        self._housekeeping = asyncio.create_task(self._housekeeping_loop())
        self._monitor = asyncio.create_task(effects.monitor(self))

    async def stop(self) -> None:
        if self._housekeeping:
            self._housekeeping.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        await self.feeds.heartbeats.leave(self.on_heartbeat)  # after its routes: they read the fleet
        if self._monitor:  # after the routes: a stopping router hands its streams to nobody
            self._monitor.cancel()

    @property
    def following(self) -> list[str]:
        """The ids of the requests whose streams this replica follows (their replies tapped or subscribed to)."""
        return list(self.follows)

    def on_heartbeat(self, hb: schemas.Heartbeat, now: float) -> None:
        self.core.on_heartbeat(hb, now)
        self.migration.on_heartbeat(hb.worker_id, now)

    async def _on_lease(self, msg: Msg) -> None:
        self.migration.on_lease(subjects.last_token(msg.subject), time.time())

    async def _on_abort(self, msg: Msg) -> None:
        try:
            abort = codec.decode(msg.data, schemas.Abort, json=codec.is_json(msg.headers))
        except codec.DecodeError:
            return
        tracked = self.migration.tracked.get(abort.request_id)
        if abort.reply_to and tracked is not None and tracked.req.reply_to != abort.reply_to:
            return  # another request of the id (a reused id's newcomer is stopped): this one runs on
        if abort.reason != MIGRATED:
            await self._drop(abort.request_id, ended=True)  # (not tracked again by a late offer reply)

    async def _on_kv_events(self, msg: Msg) -> None:
        try:
            batch = codec.decode(msg.data, schemas.KVEventBatch)
        except codec.DecodeError as e:
            log.warning("bad_kv_events", subject=msg.subject, error=str(e))
            return
        self.core.on_kv_events(subjects.last_token(msg.subject), batch, time.time())

    async def _on_macro_state(self, msg: Msg) -> None:
        try:
            self.core.on_macro_state(codec.decode(msg.data, schemas.MacroState))
        except codec.DecodeError as e:
            log.warning("bad_macro_state", subject=msg.subject, error=str(e))

    async def _on_route(self, req: Request) -> None:
        task = asyncio.create_task(self.serve_route(req))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def serve_route(self, req: Request) -> None:
        """One `llm.v1.route` request answered, as its own task (public: the seam tests wrap to
        delay an answer)."""
        try:
            ar = codec.decode(req.data, schemas.AdmittedRequestInTransit)
            check_inputs(ar)  # before any state is kept for it: the kernels' int64 would wrap
        except (*codec.DecodeError, ValueError) as e:
            await req.respond_error("400", f"bad route request: {e}")
            return
        only_header = (req.headers or {}).get(subjects.ROUTE_ONLY_HEADER)
        only = frozenset(w for w in only_header.split(",") if w) if only_header is not None else None
        decision = await self.route(ar, req.data, req.headers, only=only)
        await req.respond(codec.encode(decision))

    async def route(self, ar: schemas.AdmittedRequest, data: bytes | None = None,
                    headers: dict[str, str] | None = None,
                    only: frozenset[str] | None = None) -> schemas.RouteDecision:
        """One route request, idempotent per request: the `llm.v1.route` endpoint's work, and
        what a queue in this process calls directly (`tokenyard queue --with-router`: one NATS
        crossing fewer on the way to the first token). `data`: `ar` as it came, MessagePack;
        `only`: the workers the queue released it to (None: any)."""
        with telemetry.span(self.kind, "process", subjects.ROUTE, headers, request_id=ar.request_id) as span:
            t0 = time.perf_counter()
            decision, hit_tokens = await self.place_once(ar, span, data=data, only=only)
            self.metrics.observe(decision.outcome, time.perf_counter() - t0, hit_tokens, ar.prompt_len)
            span.set_attribute("tokenyard.outcome", decision.outcome)
            if decision.worker_id:
                span.set_attribute("tokenyard.worker_id", decision.worker_id)
        return decision

    def _fresh_rows(self) -> tuple:
        """P and BS of the fresh workers, for the P × BS spread gauge (read when scraped)."""
        view = self.core.view
        fresh = view.fresh(time.time(), self.core.cfg.stale_after_s)
        return view.queued_prefill[: view.n][fresh], view.bs[: view.n][fresh]

    async def place_once(
        self, ar: schemas.AdmittedRequest, span=None, data: bytes | None = None, only: frozenset[str] | None = None,
    ) -> tuple[schemas.RouteDecision, int | None]:
        """`place` for a queue's route request, idempotent per request (see the module and
        services/router/reask.py): the seam `route` runs, public so that tests drive it with
        `place` replaced by a placement they release."""
        key = key_of(ar)  # a P/D decode leg is placed on its own
        tracked = self.migration.tracked.get(ar.request_id)  # a placed request may have moved since
        waiter = asyncio.get_running_loop().create_future()
        match self.reask.ask(key, waiter, moved_to=tracked.worker_id if tracked is not None else None):
            case Answer(decision=decision):
                return decision, None
            case Wait():
                return await waiter, None
        # The placement runs as its own task and settles when it ends, whatever becomes of this
        # ask: a first asker cancelled mid-offer (a queue's shutdown) neither cancels an offer a
        # worker may already have taken nor leaves it unremembered (a re-ask would place it twice).
        # Its first step — the decision and the offer's publish — runs now, in the asker's turn
        # (shared/eager.py), not after whatever else the loop holds.
        placing = eager_task(self.place(ar, span, data=data, only=only))
        placing.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(placing)

    def _settle(self, key, placing: asyncio.Future) -> None:
        """A placement ended: remember it, and give the asks that joined it the same answer —
        its decision, or the error it failed with (so an in-process queue puts the request back
        as it would after its own failed ask), or cancellation if it was cancelled."""
        failed = placing.cancelled() or placing.exception() is not None
        decision = None if failed else placing.result()[0]
        for w in self.reask.settle(key, decision):
            if w.done():  # that ask was cancelled while it waited
                continue
            if decision is not None:
                w.set_result(decision)
            elif placing.cancelled():  # the router stops
                w.cancel()
            else:
                w.set_exception(placing.exception())

    async def place(
        self, ar: schemas.AdmittedRequest, span=None, exclude: frozenset[str] = frozenset(), data: bytes | None = None,
        only: frozenset[str] | None = None,
    ) -> tuple[schemas.RouteDecision, int | None]:
        """One placement (`place_once` runs it at most once per request; a re-issue runs it
        again): the decision, and the prefix-hit tokens on the worker that took the request. `data`:
        `ar` as it came, MessagePack; offered as it is (an 8k-token prompt costs ~0.3 ms of CPU
        to encode or decode, and this hop changes nothing in it).

        An offer left unanswered (a timeout, not a refusal) ends a queue's placement `unsure`:
        the worker may have taken the request, and offering it to another would start a second
        generation on the same stream. The queue asks again, and the router offers it to that
        worker first while it is alive (it answers REOFFERED if it took it). A re-issue and a
        P/D decode leg, which no queue asks again for, move on to the next worker as before."""
        rid = ar.request_id
        now = time.time()
        if self.migration.orphan(ar, now):
            return schemas.RouteDecision(rid, schemas.Outcome.ABORTED, reason="client gone"), None
        placement = Placement(self.core, ar, self.max_attempts, only=only)
        placement.excluded |= exclude
        moving = bool(exclude)  # a re-issue: the request stays followed whatever happens here
        settle = not moving and not ar.kv_from
        # Follow before any offer: the first chunk may overtake the offer's reply. A request
        # this replica follows already is left as it is (another that reused its id too), and
        # one whose stream has ended is not followed again.
        tracked = self.migration.tracked.get(rid)
        fresh = not moving and tracked is None and self.migration.ended.get(rid) != ar.reply_to
        ours = fresh or moving or (tracked is not None and tracked.req.reply_to == ar.reply_to)
        if fresh:
            self.migration.track(ar, "", now)
            self._tracking.set()
        if fresh or moving:
            await self._follow(ar)
        key = key_of(ar)
        if settle and (first := self.reask.first_offer(key)) is not None and self.migration.alive(first, now):
            reply = await self._offer(ar, first, data)
            if reply is None:
                return self._unsure(key, first), None
            if (decision := await self._answered(ar, first, reply, fresh, ours)) is not None:
                return decision, None
            placement.refused(first, reply.reason)
        while (choice := placement.next(time.time())) is not None:
            if span is not None and telemetry.recording():  # not built for a span that keeps nothing
                span.set_attributes(span_attributes(choice))
            if log.is_enabled_for(logging.DEBUG):  # TOKENYARD_LOG_LEVEL=debug: where each request went, and why
                log.debug("route_choice", request_id=rid, worker=choice.worker_id, prompt_tokens=ar.prompt_len,
                          notes=list(choice.notes), since_admitted_ms=round((time.time() - ar.arrival_s) * 1000, 2),
                          **self.core.rows())
            self.core.offer_out(choice.worker_id, ar, choice)
            try:
                reply = await self._offer(ar, choice.worker_id, data, choice.prefill)
            finally:
                self.core.offer_answered(choice.worker_id, rid)
            if reply is None and settle:
                return self._unsure(key, choice.worker_id), None
            if reply is not None and (decision := await self._answered(ar, choice.worker_id, reply, fresh, ours)):
                return decision, choice.hit_tokens
            placement.refused(choice.worker_id, reply.reason if reply else "no answer")
        if fresh:
            await self._drop(rid)
        return schemas.RouteDecision(rid, schemas.Outcome.NO_CAPACITY, reason=placement.reason), None

    async def _answered(self, ar: schemas.AdmittedRequest, worker_id: str, reply: schemas.GenerateReply,
                        fresh: bool, ours: bool) -> schemas.RouteDecision | None:
        """The decision a worker's answer makes, or None if it refused (try another)."""
        rid = ar.request_id
        if reply.accepted:
            if reply.reason == schemas.Outcome.DUPLICATE or (reply.reason == schemas.REOFFERED and fresh):
                # a reused id (the worker sent its client a 409), or a redelivery that another
                # replica, or a stream that ended, accounts for: not followed here
                if fresh:
                    await self._drop(rid)
            elif ours:  # generating there now, or again known there after an unanswered offer
                self.migration.track(ar, worker_id, time.time())
                self._tracking.set()
            return schemas.RouteDecision(rid, schemas.Outcome.ROUTED, worker_id)
        if reply.reason == schemas.Outcome.ABORTED:
            if fresh:
                await self._drop(rid)
            return schemas.RouteDecision(rid, schemas.Outcome.ABORTED, reason="aborted")
        return None

    def _unsure(self, key: tuple[str, str, str], worker_id: str) -> schemas.RouteDecision:
        """An offer went unanswered: the request stays followed (on no worker yet), and the
        queue's next ask offers it to `worker_id` first."""
        return self.reask.unsure(key, worker_id)

    async def _drop(self, request_id: str, ended: bool = False) -> None:
        self.migration.untrack(request_id, ended)
        await self._unfollow(request_id)

    async def _offer(self, ar: schemas.AdmittedRequest, worker_id: str,
                     data: bytes | None = None,
                     prefill: OfferPrefill | None = None) -> schemas.GenerateReply | None:
        """`prefill`: r's uncached tokens there and elsewhere, sent in the offer's header for the
        worker's `saturated` refusal."""
        subject = subjects.worker_generate(worker_id)
        with telemetry.span(self.kind, "send", subject, kind=SpanKind.PRODUCER, request_id=ar.request_id):
            try:
                headers = telemetry.inject()
                if prefill is not None:
                    headers = {**(headers or {}), subjects.OFFER_PREFILL_HEADER: prefill.header()}
                # published in this turn (the request's first step), and written to the socket at
                # once, not on nats-py's flusher's turn behind the rest of this turn's work
                asked = eager_task(self.nc.request(
                    subject, data or codec.encode(ar), timeout=OFFER_TIMEOUT_S, headers=headers or None
                ))
                nats_internals.send_now(self.nc)
                msg = await asked
                return codec.decode(msg.data, schemas.GenerateReply)
            except NoRespondersError:  # nobody listens there: a refusal, not a doubt
                self.migration.on_no_responders(worker_id, time.time(), natsutil.reconnected_at(self.nc))
                log.warning("offer_failed", request_id=ar.request_id, worker=worker_id, error="no responders")
                return schemas.GenerateReply(ar.request_id, False, "no responders")
            except Exception as e:  # asked, not answered: it may have taken the request
                log.warning("offer_unanswered", request_id=ar.request_id, worker=worker_id, error=repr(e))
                return None

    # ── migration ──

    async def _follow(self, ar: schemas.AdmittedRequest) -> None:
        rid = ar.request_id

        def seen(msg) -> bool:
            try:
                event = codec.decode_event(msg.data, msg.headers)
            except codec.DecodeError:
                return False
            self.migration.on_event(rid, event, time.time())
            return isinstance(event, schemas.TERMINAL_EVENTS)

        await self.follows.follow(rid, ar.reply_to, seen)

    async def _unfollow(self, request_id: str) -> None:
        await self.follows.unfollow(request_id)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            now = time.time()
            for wid in self.core.housekeeping(now):
                log.info("worker_forgotten", worker=wid)
            self.migration.forget_leases(now)


def span_attributes(choice) -> dict[str, str | int | float | bool]:
    """The decision's inputs, as span attributes (the last attempt's, if a worker refused)."""
    attrs: dict[str, str | int | float | bool] = {
        "tokenyard.router.policy": choice.policy,
        "tokenyard.router.candidates": choice.candidates,
        "tokenyard.router.fallback": choice.fallback,
        "tokenyard.router.hot_warning": choice.hot_warning,
    }
    if choice.worker_id is None:
        attrs["tokenyard.router.reason"] = choice.reason
        return attrs
    attrs.update(
        {
            "tokenyard.router.instance": choice.worker_id,
            "tokenyard.router.p_tokens": choice.p_tokens,
            "tokenyard.router.batch_size": choice.batch_size,
            "tokenyard.router.hit_tokens": choice.hit_tokens,
            "tokenyard.router.score": choice.score,
            "tokenyard.router.over_budget": choice.over_budget,
        }
    )
    return attrs
