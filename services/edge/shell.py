"""The edge's shell: an aiohttp server speaking OpenAI's HTTP API, one NATS stream per request.

    POST /v1/completions, /v1/chat/completions
        read body ─ core.parse_request ─ TokenyardClient.stream_batches (publish on llm.v1.submit)
        wait for the first event: Rejected/Error → that status as an OpenAI error body;
        Accepted → stream=true: SSE 200, one frame per event (core.Renderer), every event
                   already received written at once (one write per batch, not per token)
                   stream=false: gather until Finished, answer one JSON object
    GET /v1/models[/{model}], /metrics (Prometheus text), /openapi.json (shared.http_front),
        /live (the process answers), /health (ready: NATS, admission and a worker up; health.py)

The body limit follows the NATS server's max payload (openai_api.body_limit), so whatever the
edge takes can be sent on; every bad input is a 4xx (docs/security.md).

Several edge processes may serve one port (`tokenyard edge --processes N`, `tokenyard up
--edge-processes N`; EdgeConfig.reuse_port: SO_REUSEPORT, the kernel spreads connections over
them). Each has its own NATS connection, client lease and inbox subscription, and its own
`max_in_flight`; `/health` answers for the process the connection reached. Their metrics go
to one directory (prometheus_client's multiprocess mode, env PROMETHEUS_MULTIPROC_DIR, set by
whoever starts them), and `/metrics` on any of them is the sum over all of them.

In the queue's process (`tokenyard queue --with-admission --http-port P`, `tokenyard up`'s
default) the edge hands each request to admission by a call (AdmissionShell.submit) and gets
admission's answers straight in the stream's inbox: one process and two crossings fewer.

The HTTP status is decided before any byte goes out, hence the wait for the first event.
The edge's client holds a lease (`llm.v1.lease.<id>`, shared/client.py): if the edge dies,
the routers abort its requests within seconds. A client that goes away aborts its request:
aiohttp cancels the handler (handler_cancellation)
and the cancellation reaches `TokenyardClient.stream`, which publishes `Abort`; where the
request ends any other way without a terminal event (a failed write, a timeout) the shell
publishes the Abort itself. Each request runs in a PRODUCER span, child of an incoming
`traceparent`, so the context `stream` injects links admission's span to the caller's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import fcntl
import gc
import os
import time
import uuid
from dataclasses import dataclass, field

import msgspec
from aiohttp import web
from nats.aio.client import Client
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service
from opentelemetry.trace import SpanKind
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from tokenyard.services.edge import core
from tokenyard.services.edge.core import ApiError, Endpoint
from tokenyard.services.edge.health import HealthProbe
from tokenyard.shared import config, http_front, metrics, openai_api, schemas, subjects, telemetry, validation
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.local_admission import LocalAdmission
from tokenyard.shared.schemas import Outcome
from tokenyard.shared.service import new_instance_id

TRIM_AFTER_PEAK = 256
"""Once a burst that held this many requests at once is over (nothing in flight for
TRIM_IDLE_S), the edge collects garbage and hands freed heap pages back to the OS
(glibc's malloc_trim): without it an overload's ~30 KB per request stays in the RSS."""
TRIM_IDLE_S = 1.0


def release_memory() -> None:
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc).malloc_trim(0)


HEADERS_HOLD_S = 0.05
"""After `accepted` (the status is known: 200), how long an SSE response's headers wait for the
first token to leave with them in one send — one write here and one wake of the client on the
first token's path instead of two. A first token that takes longer (a request waiting in the
queue for room, a long prefill) finds the headers gone alone at this bound."""


class SseResponse(web.StreamResponse):
    """An SSE response whose headers leave with the first bytes of its body (in one send, as
    aiohttp's own `Response` does), not alone at `prepare`; `EdgeShell._stream_sse` bounds the
    wait (HEADERS_HOLD_S). An aiohttp without the switch sends them at `prepare`, as before."""

    _send_headers_immediately = False


_ROUTE_ATTRIBUTES = {Endpoint.COMPLETIONS: {"http.route": "/v1/completions"},  # the span's, built once
                     Endpoint.CHAT: {"http.route": "/v1/chat/completions"}}

def _sse_response(request_id: str) -> SseResponse:
    return SseResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                            "Cache-Control": "no-cache", "x-request-id": request_id})


TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def health_subject(instance_id: str) -> str:
    """The nats.micro endpoint an edge instance answers its status on."""
    return f"{subjects.PREFIX}.edge.{instance_id}.health"


@dataclass
class EdgeConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    """0 picks a free port; the bound one is `EdgeShell.port` after start."""
    models: list[str] = field(default_factory=lambda: [config.DEFAULT_MODEL])
    """Served model names (`/v1/models`); a request naming another gets 404. Empty: any."""
    request_timeout_s: float = 600.0
    """Whole-request deadline, and the longest silence between two events."""
    max_body_bytes: int | None = None
    """None: what fits a message of the NATS server the edge is connected to (its max payload
    less room for headers, openai_api.body_limit), so a body the edge takes can be sent on."""
    accept_timeout_s: float = 30.0
    """How long admission may take to accept or reject before the edge answers 503."""
    shutdown_timeout_s: float = 30.0
    """How long `stop()` lets in-flight HTTP requests finish before cancelling them."""
    max_in_flight: int = config.EDGE_MAX_IN_FLIGHT
    """Generation requests one edge holds open at once; beyond, a 503 with Retry-After at
    once. Each open request costs the edge ~10 KB that Python's allocator rarely hands
    back, so this bounds what an overload leaves behind (4,096 × 10 KB ≈ 40 MB); more
    concurrency is more edge replicas. It holds per process: N processes on one port hold
    up to N × this."""
    reuse_port: bool = False
    """Bind the HTTP port with SO_REUSEPORT, to serve it together with other edge processes."""


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's switch to multiprocess mode: each process's values go to files in
this directory (read at import, so it is set before the process starts)."""


def metrics_dir() -> str | None:
    """The directory the edge processes of one port share their metrics in, if any."""
    return os.environ.get(MULTIPROC_ENV) or None


def forget_dead_processes(path: str) -> None:
    """Drop the live gauges (in flight) of edge processes that are gone: a killed edge's
    last value would otherwise be summed for ever. Their counters stay: totals do not go back."""
    for name in os.listdir(path):
        if not name.startswith("gauge_live") or not name.endswith(".db"):
            continue
        pid = int(name.rsplit("_", 1)[1].removesuffix(".db"))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):  # the supervisor (or another child) dropped it first
                multiprocess.mark_process_dead(pid, path)
        except PermissionError:  # alive, someone else's
            pass


@contextlib.contextmanager
def fold_lock(path: str, exclusive: bool):
    """The metrics directory's lock: a scrape reads under it shared, the supervisor folds a dead
    process's files into the archive under it exclusive — so no scrape sees a file vanish
    between listing and reading it (prometheus_client then raises) or counts a folded process
    twice (a counter that goes up and back down reads as a reset)."""
    with open(os.path.join(path, ".fold.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def scrape(registry: CollectorRegistry) -> bytes:
    """The Prometheus page: this process's registry, or, in multiprocess mode, the sum over
    every edge process writing to the shared directory."""
    path = metrics_dir()
    if path is None:
        return generate_latest(registry)
    with fold_lock(path, exclusive=False):
        forget_dead_processes(path)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path)
        return generate_latest(merged)


class EdgeMetrics:
    """Prometheus metrics in a registry of their own (several edges may share a process).
    In multiprocess mode the in-flight gauge is summed over the live processes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tokenyard:edge_requests", "Generation requests by endpoint and outcome.",
                                ["endpoint", "outcome"], registry=self.registry)
        self.ttft = Histogram("tokenyard:edge_ttft_seconds", "HTTP request received → first token chunk.",
                              ["endpoint"], buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.in_flight = Gauge(
            "tokenyard:edge_in_flight_requests", "Generation requests in flight.", registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.ttft_of = {e: self.ttft.labels(e.value) for e in Endpoint}
        """Each endpoint's TTFT child, looked up once (`labels` costs more than `observe`)."""

    def snapshot(self) -> dict:
        """Requests by `endpoint,outcome`, for `$SRV.STATS` (shared/metrics.py)."""
        return {"requests": metrics.count_samples(self.requests)}


@dataclass
class _Call:
    """One HTTP generation request's bookkeeping."""

    request_id: str
    endpoint: Endpoint
    started: float
    outcome: Outcome = Outcome.FAILED
    terminal: bool = False
    """A terminal event arrived: nothing left to abort."""
    first_token: bool = False
    response: web.StreamResponse | None = None
    """The SSE response once its headers went out."""


class EdgeShell:
    kind = "edge"

    def __init__(self, cfg: EdgeConfig | None = None, instance_id: str | None = None,
                 admission: LocalAdmission | None = None):
        """`admission`: in this process, handed each request by a call; None: `llm.v1.submit`."""
        self.config = cfg or EdgeConfig()
        self.admission = admission
        self.instance_id = instance_id or new_instance_id(self.kind)
        self.metrics = EdgeMetrics()
        self.port: int | None = None
        self.in_flight = 0
        self._peak = 0
        """Most requests in flight at once since the last trim."""
        self.log = telemetry.logger(self.kind)
        self._nc: Client | None = None
        self.client: TokenyardClient | None = None  # every HTTP request's stream (made at start)
        self._runner: web.AppRunner | None = None
        self.health: HealthProbe | None = None
        self._started_at = 0
        self.max_body_bytes = 0
        self.max_payload = 0

    # ── lifecycle ──

    async def start(self, nc: Client, service: Service) -> None:
        self._nc = nc
        self.client = TokenyardClient(nc, admission=self.admission)
        self.health = HealthProbe(nc, self.admission)
        self._started_at = int(time.time())
        self.max_body_bytes = self.config.max_body_bytes or openai_api.body_limit(nc.max_payload)
        self.max_payload = nc.max_payload
        app = http_front.make_app(self, max_body_bytes=self.max_body_bytes, log=self.log, title="tokenyard edge",
                                  limits=validation.Limits(models=tuple(self.config.models)))
        self._runner, self.port = await http_front.serve(
            app, self.config.host, self.config.http_port, self.config.shutdown_timeout_s,
            reuse_port=self.config.reuse_port,
        )
        await service.add_endpoint(
            name="health", subject=health_subject(self.instance_id), handler=self._micro_health
        )
        self.log.info("http listening", host=self.config.host, port=self.port, models=self.config.models)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.client is not None:
            await self.client.close()  # ends its lease: nothing of this edge's is left running

    # ── generation ──

    async def on_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def on_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            request_id = core.request_id_from(request.headers.get("x-request-id"), uuid.uuid4().hex)
        except ApiError as e:
            self.metrics.requests.labels(endpoint.value, e.outcome().value).inc()
            return http_front.error_response(e, None)
        if self.in_flight >= self.config.max_in_flight:
            self.metrics.requests.labels(endpoint.value, Outcome.REJECTED_CAPACITY.value).inc()
            busy = ApiError(503, f"the edge holds {self.in_flight} requests, its limit", code="edge_busy",
                            retry_after_s=1.0)
            return http_front.error_response(busy, request_id)
        call = _Call(request_id, endpoint, time.monotonic())
        parent = {k: v for k in ("traceparent", "tracestate") if (v := request.headers.get(k))}
        self.metrics.in_flight.inc()
        self.in_flight += 1
        self._peak = max(self._peak, self.in_flight)
        try:
            with telemetry.span(
                "edge",
                "publish",
                subjects.SUBMIT,
                headers=parent or None,
                kind=SpanKind.PRODUCER,
                request_id=request_id,
                attributes=_ROUTE_ATTRIBUTES[endpoint],
            ) as span:
                response = await self._serve(request, call)
                span.set_attribute("http.response.status_code", response.status)
                return response
        except asyncio.CancelledError:
            call.outcome = Outcome.ABORTED
            raise
        finally:
            self.metrics.in_flight.dec()
            self.in_flight -= 1
            if self.in_flight == 0 and self._peak >= TRIM_AFTER_PEAK:
                asyncio.get_running_loop().call_later(TRIM_IDLE_S, self._trim_if_idle)
            self.metrics.requests.labels(endpoint.value, call.outcome.value).inc()

    async def _serve(self, request: web.Request, call: _Call) -> web.StreamResponse:
        """Published once the body is read and checked; the renderer and deadlines follow it."""
        try:
            body = await http_front.read_body(request, self.max_body_bytes)
            req = core.parse_request(body, call.endpoint, self.config.models, call.request_id,
                                     max_payload=self.max_payload)
            headers = core.nats_headers(request.headers)
        except ApiError as e:
            call.outcome = e.outcome()
            return http_front.error_response(e, call.request_id)
        assert self.client is not None
        events = self.client.stream_batches(req, headers=headers, idle_timeout_s=self.config.request_timeout_s,
                                             published=True)
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                try:
                    async with asyncio.timeout(self.config.accept_timeout_s):  # the publish too (a stalled connection)
                        early = await anext(events)  # the request is out (or, from a closed client, its end)
                        renderer = core.Renderer(call.endpoint, req, created=int(time.time()))  # while it travels
                        sse = _sse_response(call.request_id) if req.stream else None  # unused if refused
                        batch = self._seen(call, early) if early else await self._next(call, events)
                except TimeoutError:
                    raise ApiError(
                        503, "admission did not answer in time", code="admission_unavailable"
                    ) from None
                if isinstance(batch[0], schemas.Rejected | schemas.Error):
                    raise core.error_from_event(batch[0])
                if sse is not None:
                    return await self._stream_sse(request, call, sse, renderer, batch, events)
                while True:
                    for event in batch:
                        renderer.feed(event)
                    if call.terminal:
                        break
                    batch = await self._next(call, events)
                call.outcome = Outcome.FINISHED
                return web.json_response(
                    renderer.response(), dumps=http_front.dumps, headers={"x-request-id": call.request_id}
                )
        except ApiError as e:
            call.outcome = e.outcome() if call.terminal else Outcome.FAILED
            return await self._fail(call, e)
        except TimeoutError:
            call.outcome = Outcome.FAILED
            return await self._fail(
                call, ApiError(504, f"no answer within {self.config.request_timeout_s:g} s", code="timeout")
            )
        except ConnectionResetError:
            call.outcome = Outcome.ABORTED
            return call.response or web.Response(status=499)
        finally:
            # A stream left before its end aborts its generation as it closes (`client_left`, that
            # generation only); a cancelled one aborted as it was cancelled (`client_cancelled`).
            # One abort each, sent by the client stream, none by the edge itself.
            await events.aclose()

    def _trim_if_idle(self) -> None:
        if self.in_flight == 0 and self._peak >= TRIM_AFTER_PEAK:
            self._peak = 0
            release_memory()

    async def _fail(self, call: _Call, err: ApiError) -> web.StreamResponse:
        """An error answer: a JSON body while the status is still open, else an SSE error frame."""
        if call.response is None:
            return http_front.error_response(err, call.request_id)
        with contextlib.suppress(ConnectionResetError):
            await call.response.write(core.sse(err.error_dict()) + core.SSE_DONE)
        return call.response

    async def _stream_sse(self, request, call: _Call, response: SseResponse, renderer: core.Renderer,
                          batch: list[schemas.StreamEvent], events) -> web.StreamResponse:
        await response.prepare(request)  # the headers wait for the first frames (SseResponse)
        call.response = response
        sent = False  # the headers: out yet?
        while True:
            # Every event that came while the last write went out, in one write: a client that
            # fell behind a burst catches up in one send, not one per token.
            data = renderer.render(batch)
            if call.terminal:
                break
            if data:
                await response.write(data)
                sent = True
            if sent:
                batch = await self._next(call, events)
            else:
                batch, sent = await self._next_holding_headers(call, events, response)
        call.outcome = Outcome.FINISHED if isinstance(batch[-1], schemas.Finished) else Outcome.FAILED
        await response.write_eof(data)  # the last frames and the end of the body (and the headers): one send
        return response

    async def _next_holding_headers(self, call: _Call, events,
                                    response: web.StreamResponse) -> tuple[list[schemas.StreamEvent], bool]:
        """`_next` while nothing of the body has gone out: the headers wait in the response's
        buffer for the first frames, and leave alone after HEADERS_HOLD_S. (The batch, whether
        the headers went out.)"""
        nxt = asyncio.ensure_future(self._next(call, events))
        try:
            done, _ = await asyncio.wait({nxt}, timeout=HEADERS_HOLD_S)
            if not done:
                await response.write(b"")  # the status alone: the first token is not near
            return await nxt, not done
        except BaseException:
            # the client went away (cancelled, or a failed write), or the deadline came: the
            # stream's own cancellation aborts the request, and ends before the caller closes it
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            raise

    async def _next(self, call: _Call, events) -> list[schemas.StreamEvent]:
        """The events that arrived since the last call (at least one; a terminal one comes
        last); a cancellation here has reached the client stream, which aborts."""
        try:
            batch = await anext(events)
        except StopAsyncIteration:
            raise ApiError(502, "the request's stream ended without a result") from None
        return self._seen(call, batch)

    def _seen(self, call: _Call, batch: list[schemas.StreamEvent]) -> list[schemas.StreamEvent]:
        """Note what a batch says of the call (ended; first token: its TTFT), and hand it on."""
        if isinstance(batch[-1], schemas.TERMINAL_EVENTS):
            call.terminal = True
        if not call.first_token and any(isinstance(e, schemas.Chunk) for e in batch):
            call.first_token = True
            self.metrics.ttft_of[call.endpoint].observe(time.monotonic() - call.started)
        return batch

    # ── the rest of the API ──

    async def on_models(self, request: web.Request) -> web.Response:
        return web.json_response(core.models_list(self.config.models, self._started_at), dumps=http_front.dumps)

    async def on_model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.config.models:
            return http_front.error_response(
                ApiError(404, f"The model `{model}` does not exist.", code="model_not_found"), None
            )
        return web.json_response(core.model_card(model, self._started_at), dumps=http_front.dumps)

    async def on_health(self, request: web.Request) -> web.Response:
        assert self.health is not None
        verdict = await self.health.readiness()
        return web.json_response(verdict.body, status=verdict.status)

    async def on_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=scrape(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def kept(self) -> dict[str, int]:  # per-request state, counted (shared/service.py)
        return {"in_flight": self.in_flight, "streams": len(self.client.open_streams()) if self.client else 0}

    async def _micro_health(self, req: MicroRequest) -> None:
        assert self.health is not None
        status = {
            **(await self.health.readiness()).body,
            "instance": self.instance_id,
            "http": f"http://{self.config.host}:{self.port}",
            "models": self.config.models,
            "in_flight": self.in_flight,
        }
        await req.respond(msgspec.json.encode(status))

