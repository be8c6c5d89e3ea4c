"""One aiohttp application for every OpenAI-compatible HTTP front: the edge (in front of the
fleet) and a worker's own (`tokenyard worker --http`, straight from its engine). A front
implements the handlers (`OpenAIFront`); this module owns what must not differ between them:

    routes        POST /v1/completions, /v1/chat/completions; GET /v1/models[/{model}],
                  /health (the front's readiness), /live (liveness: the process answers, here),
                  /metrics, /openapi.json (openapi_document)
    body limit    client_max_size = the front's limit; a larger body is a 413, never read whole;
                  one that has not arrived whole within BODY_READ_S is a 408 (its slot freed)
    errors        aiohttp's own (404, 405, 413) and any crash as OpenAI's error body; a crash
                  is logged and answered 500 (a bug: tests hold every bad input to a 4xx)
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import msgspec
from aiohttp import web
from tokenyard.shared import schemas, validation
from tokenyard.shared.openai_api import ApiError


class OpenAIFront(Protocol):
    async def on_completions(self, request: web.Request) -> web.StreamResponse: ...
    async def on_chat(self, request: web.Request) -> web.StreamResponse: ...
    async def on_models(self, request: web.Request) -> web.StreamResponse: ...
    async def on_model(self, request: web.Request) -> web.StreamResponse: ...
    async def on_health(self, request: web.Request) -> web.StreamResponse: ...
    async def on_metrics(self, request: web.Request) -> web.StreamResponse: ...


def make_app(front: OpenAIFront, *, max_body_bytes: int, log, title: str,
             limits: validation.Limits | None = None) -> web.Application:
    """The application a front serves; `log` records crashes (structlog logger); `limits`
    (served models, context length) are stated in the OpenAPI document."""
    document = msgspec.json.encode(openapi_document(title, max_body_bytes, limits or validation.Limits()))

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    async def live(request: web.Request) -> web.Response:  # restart on this; readiness is /health's
        return web.json_response({"status": "live"})

    @web.middleware
    async def errors(request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
            message = f"{request.method} {request.path}: {e.reason}"
            response = error_response(ApiError(e.status, message, code=code))
            if "Allow" in e.headers:
                response.headers["Allow"] = e.headers["Allow"]
            return response
        except ApiError as e:
            return error_response(e)
        except Exception:
            log.exception("http handler failed", path=request.path)
            return error_response(ApiError(500, "internal error", code="internal_error"))

    app = web.Application(client_max_size=max_body_bytes, middlewares=[errors])
    app.add_routes([
        web.post("/v1/completions", front.on_completions),
        web.post("/v1/chat/completions", front.on_chat),
        web.get("/v1/models", front.on_models),
        web.get("/v1/models/{model:.+}", front.on_model),
        web.get("/health", front.on_health),
        web.get("/live", live),
        web.get("/metrics", front.on_metrics),
        web.get("/openapi.json", openapi),
    ])
    return app


async def serve(app: web.Application, host: str, port: int, shutdown_timeout_s: float = 30.0,
                reuse_port: bool = False) -> tuple[web.AppRunner, int]:
    """Start `app` on host:port (0: a free port); the runner to clean up, and the bound port.
    A client that goes away cancels its handler (handler_cancellation), which aborts its
    request wherever it runs. `reuse_port`: SO_REUSEPORT, so several processes serve the port."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout_s, access_log=None)
    await runner.setup()
    # A deep accept backlog: under a burst, clients should get a fast 503, not a connect timeout.
    await web.TCPSite(runner, host, port, backlog=4096, reuse_port=reuse_port or None).start()
    return runner, runner.addresses[0][1]


BODY_READ_S = 60.0
"""The longest a request's body may take to arrive (a whole 1 MiB one at 17 KiB/s). A client that
announces a Content-Length and never sends it all held its request's place among the edge's
`max_in_flight` for as long as it kept the connection open: a few thousand such made the edge
refuse everyone (503 edge_busy)."""


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, or a 413 before reading it when the client announced more than `limit`, or a
    408 when it has not arrived within BODY_READ_S."""
    too_big = ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")
    if request.content_length is not None and request.content_length > limit:
        raise too_big
    try:
        async with asyncio.timeout(BODY_READ_S):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_big from None
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {BODY_READ_S:g} s",
                       code="request_timeout") from None


def dumps(obj: Any) -> str:
    return msgspec.json.encode(obj).decode()


def error_response(err: ApiError, request_id: str | None = None) -> web.Response:
    headers = err.headers()
    if request_id:
        headers["x-request-id"] = request_id
    return web.Response(status=err.status, body=err.body(), content_type="application/json", headers=headers)


# ── the OpenAPI document ──

_REF = "#/components/schemas/{name}"
_CHAT_ONLY = ("messages",)
_COMPLETION_ONLY = ("prompt", "block_hashes", "prompt_len")
_REPLAY = ("block_hashes", "prompt_len")
"""Trace replay (hashes instead of text) is tokenyard's own and takes the place of `prompt`:
left out of the document, which describes OpenAI's API."""


def openapi_document(title: str, max_body_bytes: int, limits: validation.Limits) -> dict[str, Any]:
    """OpenAPI 3.1 for the routes above. The request schemas are msgspec's own for
    GenerateRequest (so they cannot drift from what the decoder accepts) with the rules of
    shared.validation added, split per endpoint into completions (`prompt` required) and
    chat (`messages` required, roles named)."""
    (generate,), components = msgspec.json.schema_components((schemas.GenerateRequest,), ref_template=_REF)
    base = components.pop("GenerateRequest")
    for name, rule in validation.json_schema_rules(limits).items():
        _constrain(base["properties"][name], rule)
    for name, accepted in validation.UNSUPPORTED.items():  # only the values that ask for nothing
        base["properties"][name] = {"enum": list(accepted), "description": f"`{name}` is not supported: "
                                    "any other value is a 400 unsupported_parameter"}
    components["ChatMessage"]["properties"]["role"] = {"enum": list(validation.CHAT_ROLES)}
    components["CompletionRequest"] = _variant(base, drop=_CHAT_ONLY + _REPLAY, required="prompt")
    components["ChatCompletionRequest"] = _variant(base, drop=_COMPLETION_ONLY, required="messages")
    components["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
    }
    obj = {"application/json": {"schema": {"type": "object"}}}
    error = {"description": "OpenAI's error body", "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    generated = {
        "200": {"description": "A completion object, or with `stream: true` server-sent events (`data: {chunk}` … "
                               "`data: [DONE]`)",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {"schema": {"type": "string"}}}},
        **{str(s): error for s in (400, 401, 404, 413, 429)},
        "503": {**error, "description": "the fleet is saturated (Retry-After) or admission is unreachable"},
    }

    def generation(name: str, summary: str) -> dict[str, Any]:
        return {"post": {
            "summary": summary,
            "parameters": [
                {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string"}},
                {"name": "x-request-tier", "in": "header", "required": False,
                 "schema": {"type": "string", "enum": ["P0", "P1", "P2", "P3"]}},
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": _REF.format(name=name)}}}},
            "responses": generated,
        }}

    def get(description: str, content_type: str = "application/json", errors=()) -> dict[str, Any]:
        return {"get": {"responses": {"200": {"description": description,
                                              "content": {content_type: {"schema": {"type": "object" if content_type == "application/json" else "string"}}}},
                                      **{str(s): error for s in errors}}}}

    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": (
            f"OpenAI-compatible; bodies up to {max_body_bytes} bytes. A field no engine here honours "
            "(logprobs, echo, tools, response_format, … : each one's `enum` holds the values that pass) is a 400 "
            "unsupported_parameter naming it. /health is readiness (503 with a `reason`), /live liveness.")},
        "paths": {
            "/v1/completions": generation("CompletionRequest", "Text completion"),
            "/v1/chat/completions": generation("ChatCompletionRequest", "Chat completion"),
            "/v1/models": get("The served models"),
            "/v1/models/{model}": {"get": {**get("One model", errors=(404,))["get"], "parameters": [
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]}},
            "/health": {"get": {"responses": {
                "200": {"description": "Ready: the edge is connected to NATS, an admission answers and counts "
                                       "`workers_up` ≥ 1 (a worker's own front: its engine runs)", "content": obj},
                "503": {"description": "Not ready: `reason` is nats_disconnected, admission_unavailable, "
                                       "admission_disconnected or no_workers; `message` says more", "content": obj}}}},
            "/live": get("Live: the process answers (a liveness probe; readiness is /health)"),
            "/metrics": get("Prometheus text", content_type="text/plain"),
        },
        "components": {"schemas": components},
    }


def _constrain(prop: dict[str, Any], rule: dict[str, Any]) -> None:
    """Add `rule` to a property, inside its non-null branch when it is optional."""
    branches = prop.get("anyOf")
    if branches:
        for branch in branches:
            if branch.get("type") != "null":
                branch.update(rule)
    else:
        prop.update(rule)


def _variant(base: dict[str, Any], drop: tuple[str, ...], required: str) -> dict[str, Any]:
    props = {k: v for k, v in base["properties"].items() if k not in drop}
    return {**base, "properties": props, "required": [required]}
