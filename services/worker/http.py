"""A worker's own OpenAI-compatible HTTP front, served straight from its engine as `vllm serve`
does, so a third-party router can sit in front of a fleet of workers (`tokenyard worker …
--http PORT`). The fleet's NATS path (admission → queue → router → worker) is untouched;
this is a second door into the same engine.

    POST /v1/completions, /v1/chat/completions (stream or not)
        body ─ openai_api.parse_request ─ shared.validation.check + tokenize (admission's own
        functions) ─ AdmittedRequest ─ engine.generate ─ openai_api.Renderer
    (the app itself, routes, body limit and error bodies: shared.http_front, as the edge's)
    GET  /v1/models[/{model}], /health (engine started and taking work), /metrics

`/metrics` speaks vLLM's names (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
`vllm:num_preemptions_total`, `vllm:request_success_total`, prompt/generation token
totals) from the engine's stats, plus tokenyard's own (queued prefill tokens, host KV tier,
step time), so routers that scrape vLLM read a tokenyard worker unchanged. Usage carries
`prompt_tokens_details.cached_tokens`. A client that goes away aborts its request in the
engine (aiohttp cancels the handler; the engine stream's cleanup aborts).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from aiohttp import web
from tokenyard.services.worker.engine import Engine
from tokenyard.shared import config, http_front, schemas, telemetry, validation
from tokenyard.shared.openai_api import (
    SSE_DONE,
    ApiError,
    Endpoint,
    Renderer,
    api_error,
    body_limit,
    model_card,
    models_list,
    parse_request,
    request_id_from,
    sse,
)
from tokenyard.shared.tokenizer import Tokenizer

log = telemetry.logger("worker-http")


@dataclass
class HttpFrontConfig:
    port: int = 8100
    """0 picks a free port; the bound one is `WorkerHttp.port` after start."""
    host: str = "127.0.0.1"
    model: str = config.DEFAULT_MODEL
    block_size: int = config.BLOCK_SIZE
    max_model_len: int = config.MAX_MODEL_LEN
    max_waiting: int = 256
    """Refuse with 503 when this many requests already wait in the engine."""
    max_body_bytes: int = body_limit(1024 * 1024)
    """The edge's limit on a default NATS server (1 MiB max payload), so both fronts take the same bodies."""


class WorkerHttp:
    def __init__(self, engine: Engine, tokenizer: Tokenizer, cfg: HttpFrontConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.port: int | None = None
        self.started_at = 0
        self.finished: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.started_at = int(time.time())
        app = http_front.make_app(self, max_body_bytes=self.cfg.max_body_bytes, log=log, title="tokenyard worker",
                                  limits=self._limits())
        self._runner, self.port = await http_front.serve(app, self.cfg.host, self.cfg.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ── generation ──

    async def on_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def on_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            rid = request_id_from(request.headers.get("x-request-id"), f"http-{uuid.uuid4().hex}")
            body = await http_front.read_body(request, self.cfg.max_body_bytes)
            req = parse_request(body, endpoint, [self.cfg.model], rid, max_model_len=self.cfg.max_model_len)
            ar = self.admit(req, endpoint)
        except ApiError as e:
            return http_front.error_response(e)
        renderer = Renderer(endpoint, req, created=int(time.time()))
        self.prompt_tokens += ar.prompt_len
        events = self._events(ar, endpoint)
        try:
            if not req.stream:
                for event in [e async for e in events]:
                    renderer.feed(event)
                return web.json_response(renderer.response(), dumps=http_front.dumps, headers={"x-request-id": rid})
            response = web.StreamResponse(status=200, headers={
                "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "x-request-id": rid,
            })
            await response.prepare(request)
            try:
                async for event in events:
                    frames = renderer.frames(event)
                    if frames:
                        await response.write(b"".join(frames))
            except ApiError as e:  # after the headers: an error frame, as the edge sends it
                await response.write(sse(e.error_dict()) + SSE_DONE)
            await response.write_eof()
            return response
        except ApiError as e:
            return http_front.error_response(e)
        finally:
            await events.aclose()

    def _limits(self) -> validation.Limits:
        return validation.Limits(models=(self.cfg.model,), max_model_len=self.cfg.max_model_len,
                                 block_size=self.cfg.block_size)

    def admit(self, req: schemas.GenerateRequest, endpoint: Endpoint) -> schemas.AdmittedRequest:
        """The worker front's admission of one request (public: tests hold it to admission's).
        What admission does for a request (shared.validation, the same functions), without
        its fleet-wide parts (tiers, rates); then what only this engine can say: KV capacity
        and a full waiting line."""
        limits = self._limits()
        checked = validation.check(req, limits)
        if isinstance(checked, validation.Invalid):
            raise api_error(checked)
        prepared = validation.tokenize(req, checked, self.tokenizer, limits)
        if isinstance(prepared, validation.Invalid):
            raise api_error(prepared)
        tokens, prompt_len, chain, max_tokens = (prepared.tokens, prepared.prompt_len, prepared.chain,
                                                  prepared.max_tokens)
        param = checked.prompt_param
        stats = self.engine.stats()
        blocks = -(-(prompt_len + max_tokens) // stats.block_size)
        if blocks > stats.kv_blocks_used + stats.kv_blocks_free:
            raise ApiError(400, f"the request needs {blocks} KV blocks; the engine has "
                                f"{stats.kv_blocks_used + stats.kv_blocks_free}", param=param,
                           code="context_length_exceeded")
        if stats.waiting >= self.cfg.max_waiting:
            raise ApiError(503, "the engine's waiting line is full", code="overloaded", retry_after_s=1.0)
        return schemas.AdmittedRequest(
            request_id=req.request_id or "", reply_to="", model=req.model, prompt_token_ids=tokens,
            prompt_len=prompt_len, block_hashes=chain, block_size=self.cfg.block_size, max_tokens=max_tokens,
            priority=min(max(req.priority, 0), 3), arrival_s=time.time(), json=True,
            sampling=validation.sampling(req),
            kind="chat" if endpoint is Endpoint.CHAT else "completion",
        )

    async def _events(self, ar: schemas.AdmittedRequest, endpoint: Endpoint):
        """The request's engine outputs as the stream events the Renderer takes."""
        rid = ar.request_id
        yield schemas.Accepted(rid, ar.priority, ar.prompt_len)
        seq = tokens = cached = 0
        stream = self.engine.generate(ar)
        try:
            async for out in stream:
                cached = out.num_cached_tokens
                if out.new_token_ids:
                    tokens += len(out.new_token_ids)
                    self.generation_tokens += len(out.new_token_ids)
                    yield schemas.Chunk(rid, seq, self.tokenizer.decode(out.new_token_ids), list(out.new_token_ids))
                    seq += 1
                if out.finished:
                    reason = out.finish_reason or "stop"
                    self.finished[reason] += 1
                    usage = schemas.Usage(ar.prompt_len, tokens, ar.prompt_len + tokens, cached)
                    yield schemas.Finished(rid, seq, reason, usage)
                    return
        except ValueError as e:  # the engine refused it (e.g. larger than its KV cache)
            raise ApiError(400, str(e), code="invalid_value") from None
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    # ── the rest ──

    async def on_models(self, request: web.Request) -> web.Response:
        return web.json_response(models_list([self.cfg.model], self.started_at), dumps=http_front.dumps)

    async def on_model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model != self.cfg.model:
            return http_front.error_response(ApiError(404, f"The model `{model}` does not exist.", code="model_not_found"))
        return web.json_response(model_card(model, self.started_at), dumps=http_front.dumps)

    async def on_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def on_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain", charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    def metrics_text(self) -> str:
        """Prometheus text exposition, vLLM's metric names where one exists."""
        s = self.engine.stats()
        label = f'model_name="{self.cfg.model}"'
        total = s.kv_blocks_used + s.kv_blocks_free
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float, labels: str = label) -> None:
            if not any(line.startswith(f"# HELP {name} ") for line in lines):
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{{{labels}}} {value}")

        metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", s.running)
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to run.", s.waiting)
        metric("vllm:kv_cache_usage_perc", "gauge", "GPU KV-cache usage, 1 = full.",
               s.kv_blocks_used / total if total else 0.0)
        metric("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               s.prefix_queries)
        metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", s.prefix_hits)
        metric("vllm:num_preemptions_total", "counter", "Preemptions.", s.preemptions)
        metric("vllm:prompt_tokens_total", "counter", "Prompt tokens of requests served over HTTP.",
               self.prompt_tokens)
        metric("vllm:generation_tokens_total", "counter", "Tokens generated for requests served over HTTP.",
               self.generation_tokens)
        for reason in sorted(self.finished) or ["length"]:
            metric("vllm:request_success_total", "counter", "Requests finished, by reason.",
                   self.finished[reason], f'{label},finished_reason="{reason}"')
        metric("tokenyard_worker_queued_prefill_tokens", "gauge", "Prompt tokens not yet prefilled.",
               s.queued_prefill_tokens)
        metric("tokenyard_worker_kv_blocks", "gauge", "KV blocks by tier and state.", s.kv_blocks_used,
               f'{label},tier="gpu",state="used"')
        metric("tokenyard_worker_kv_blocks", "gauge", "KV blocks by tier and state.", s.kv_blocks_free,
               f'{label},tier="gpu",state="free"')
        metric("tokenyard_worker_kv_blocks", "gauge", "KV blocks by tier and state.", s.kv_host_blocks_used,
               f'{label},tier="host",state="used"')
        metric("tokenyard_worker_kv_blocks", "gauge", "KV blocks by tier and state.", s.kv_host_blocks_free,
               f'{label},tier="host",state="free"')
        metric("tokenyard_worker_step_time_seconds", "gauge", "The engine's last step time.",
               s.step_time_ms / 1000.0)
        return "\n".join(lines) + "\n"


class WithHttpFront:
    """A worker shell and its HTTP front, started and stopped together (the front after the
    engine is up, and first to stop)."""

    def __init__(self, shell, front: WorkerHttp):
        self.shell = shell
        self.front = front
        self.kind = shell.kind
        self.instance_id = shell.instance_id

    async def start(self, nc, service) -> None:
        await self.shell.start(nc, service)
        await self.front.start()

    async def stop(self) -> None:
        await self.front.stop()
        await self.shell.stop()


async def serve_engine(engine: Engine, tokenizer: Tokenizer, cfg: HttpFrontConfig) -> WorkerHttp:
    """Start an engine and its HTTP front without NATS (tests, a standalone sim server)."""
    await engine.start()
    front = WorkerHttp(engine, tokenizer, cfg)
    await front.start()
    return front

