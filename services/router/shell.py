"""The router's shell: a `nats.micro` endpoint on `llm.v1.route` (queue group `router`: each
replica keeps its own fleet view and KV block index from the fan-out subjects — heartbeats,
KV events `llm.v1.kv.<id>`, macro states — and takes a share of the decisions). For each request: the core picks a worker, the shell offers the request to it
(`llm.v1.worker.<id>.generate`, request/reply); on a refusal or a timeout it asks the core
again without that worker, up to `max_attempts`, then answers `no_capacity`.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.request import Request
from nats.micro.service import Service
from opentelemetry.trace import SpanKind
from tokenyard.services.router.core import ROUTE_ATTEMPTS, Placement, RouterConfig, RouterCore
from tokenyard.shared import codec, schemas, subjects, telemetry
from tokenyard.shared.metrics import RouterMetrics
from tokenyard.shared.service import new_instance_id

log = telemetry.logger("router")

OFFER_TIMEOUT_S = 2.0


class RouterShell:
    kind = "router"

    def __init__(self, cfg: RouterConfig, max_attempts: int = ROUTE_ATTEMPTS):
        self.core = RouterCore(cfg)
        self.instance_id = new_instance_id(self.kind)
        self.max_attempts = max_attempts
        self.metrics = RouterMetrics(cfg.policy)
        self._inflight: set[asyncio.Task] = set()
        self._housekeeping: asyncio.Task | None = None

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = nc
        await nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        await nc.subscribe(subjects.MACRO_STATE_ALL, cb=self._on_macro_state)
        await nc.subscribe(subjects.KV_EVENTS_ALL, cb=self._on_kv_events)
        await service.add_endpoint(
            name="route", subject=subjects.ROUTE, queue_group=subjects.GROUP_ROUTER, handler=self._on_route
        )
        self._housekeeping = asyncio.create_task(self._housekeeping_loop())

    async def stop(self) -> None:
        if self._housekeeping:
            self._housekeeping.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            self.core.on_heartbeat(codec.decode(msg.data, schemas.Heartbeat), time.time())
        except codec.DecodeError as e:
            log.warning("bad_heartbeat", subject=msg.subject, error=str(e))

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
        task = asyncio.create_task(self._route(req))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _route(self, req: Request) -> None:
        try:
            ar = codec.decode(req.data, schemas.AdmittedRequest)
        except codec.DecodeError as e:
            await req.respond_error("400", f"bad route request: {e}")
            return
        with telemetry.span(
            self.kind, "process", subjects.ROUTE, req.headers, request_id=ar.request_id
        ) as span:
            t0 = time.perf_counter()
            decision, hit_tokens = await self._place(ar, span)
            self.metrics.observe(decision.outcome, time.perf_counter() - t0, hit_tokens, ar.prompt_len)
            view = self.core.view
            fresh = view.fresh(time.time(), self.core.cfg.stale_after_s)
            self.metrics.observe_fleet(view.queued_prefill[: view.n][fresh], view.bs[: view.n][fresh])
            span.set_attribute("tokenyard.outcome", decision.outcome)
            if decision.worker_id:
                span.set_attribute("tokenyard.worker_id", decision.worker_id)
        await req.respond(codec.encode(decision))

    async def _place(self, ar: schemas.AdmittedRequest, span=None) -> tuple[schemas.RouteDecision, int | None]:
        """The decision, and the prefix-hit tokens on the worker that took the request."""
        placement = Placement(self.core, ar, self.max_attempts)
        while (choice := placement.next(time.time())) is not None:
            if span is not None:
                span.set_attributes(span_attributes(choice))
            reply = await self._offer(ar, choice.worker_id)
            if reply is not None and reply.accepted:
                return schemas.RouteDecision(ar.request_id, schemas.Outcome.ROUTED, choice.worker_id), choice.hit_tokens
            if reply is not None and reply.reason == schemas.Outcome.ABORTED:
                return schemas.RouteDecision(ar.request_id, schemas.Outcome.ABORTED, reason="aborted"), None
            placement.refused(choice.worker_id, reply.reason if reply else "no answer")
        return schemas.RouteDecision(ar.request_id, schemas.Outcome.NO_CAPACITY, reason=placement.reason), None

    async def _offer(self, ar: schemas.AdmittedRequest, worker_id: str) -> schemas.GenerateReply | None:
        subject = subjects.worker_generate(worker_id)
        with telemetry.span(self.kind, "send", subject, kind=SpanKind.PRODUCER, request_id=ar.request_id):
            try:
                msg = await self.nc.request(
                    subject, codec.encode(ar), timeout=OFFER_TIMEOUT_S, headers=telemetry.inject()
                )
                return codec.decode(msg.data, schemas.GenerateReply)
            except Exception as e:
                log.warning("offer_failed", request_id=ar.request_id, worker=worker_id, error=repr(e))
                return None

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            for wid in self.core.housekeeping(time.time()):
                log.info("worker_forgotten", worker=wid)


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
