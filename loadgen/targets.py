"""Where requests go, and how each one's stream is timed into its RequestRecord.

* `nats://…`: `shared.client.TokenyardClient.stream(GenerateRequest)` on one shared
  connection; events Accepted, Chunk (seq, text, token_ids), then Finished (usage,
  finish_reason), or Rejected / Error. A Rejected counts as a failure labelled by its
  status (`status_429`; `status_503` when no admission listens: the client turns nats's
  "no responders" into a 503 rejection), an Error as `error_<status>`, an undecodable
  message as `bad_event`.
* `http://…`: POST `/v1/completions` with `stream: true` and
  `stream_options.include_usage`, read as SSE until `data: [DONE]`. A non-200 answer is a
  failure `status_<code>`; an `{"error": …}` frame mid-stream is `error_<code>`. A choice
  with empty text *and* a finish_reason is the edge's end marker, not a token, so it is not
  timed as a chunk (vLLM puts finish_reason on the last token's chunk instead).

Every timestamp is time.perf_counter(), taken as the event arrives, before decoding.
A target only fills records; timeouts and failures of the transport are the caller's.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import aclosing
from time import perf_counter
from typing import Any, Protocol

import aiohttp
import msgspec
from nats.aio.client import Client
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.sse import SSEReader
from tokenyard.loadgen.workload import BenchRequest
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import TokenyardClient


class Target(Protocol):
    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        """Send one request and record its stream; returns when the stream ends."""
        ...

    async def close(self) -> None: ...


def _generate_request(
    request: BenchRequest, model: str, request_id: str, tenant: str | None
) -> schemas.GenerateRequest:
    return schemas.GenerateRequest(
        model=model,
        prompt=request.prompt,
        max_tokens=request.max_tokens,
        priority=request.priority,
        ignore_eos=request.ignore_eos,
        stream=True,
        stream_options=schemas.StreamOptions(include_usage=True),
        request_id=request_id,
        tenant=tenant,
        block_hashes=list(request.block_hashes) if request.block_hashes is not None else None,
        prompt_len=request.prompt_len if request.prompt is None else None,
        tpot_slo_ms=request.tpot_slo_ms,
    )


def tier_headers(request: BenchRequest) -> dict[str, str]:
    """The class a request asks for, as a client does (`x-request-tier`): vLLM's `priority`
    field alone cannot ask for P0, since admission reads its default 0 as "not declared"."""
    return {"x-request-tier": f"P{request.priority}"}


class NatsTarget:
    def __init__(self, client: TokenyardClient, model: str, idle_timeout_s: float, tenant: str | None = None):
        self.client = client
        self.model = model
        self.idle_timeout_s = idle_timeout_s
        self.tenant = tenant
        self.run_id = uuid.uuid4().hex[:8]

    @classmethod
    async def connect(
        cls,
        url: str,
        model: str,
        idle_timeout_s: float,
        tenant: str | None = None,
        connect_timeout_s: float = 10.0,
    ) -> NatsTarget:
        client = TokenyardClient(await connect_nats(url, connect_timeout_s), owns_connection=True)
        return cls(client, model, idle_timeout_s, tenant)

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        req = _generate_request(request, self.model, f"bench-{self.run_id}-{request.index}", self.tenant)
        record.send_s = perf_counter()
        stream = self.client.stream(req, headers=tier_headers(request), idle_timeout_s=self.idle_timeout_s)
        try:
            await self._read(stream, record)
        except msgspec.DecodeError as e:
            record.end_s = perf_counter()
            record.fail("bad_event", str(e))

    @staticmethod
    async def _read(stream, record: RequestRecord) -> None:
        async with aclosing(stream) as events:
            async for event in events:
                now = perf_counter()
                match event:
                    case schemas.Chunk():
                        record.chunk_s.append(now)
                        record.streamed_tokens += len(event.token_ids)
                    case schemas.Accepted():
                        record.accepted_s = now
                    case schemas.Finished():
                        record.end_s = now
                        record.finish_reason = event.finish_reason
                        record.usage_completion_tokens = event.usage.completion_tokens
                        record.usage_prompt_tokens = event.usage.prompt_tokens
                    case schemas.Rejected():
                        record.end_s = now
                        record.fail(f"status_{event.status}", f"{event.code}: {event.message}")
                    case schemas.Error():
                        record.end_s = now
                        record.fail(f"error_{event.status}", event.message)

    async def close(self) -> None:
        await self.client.close()


async def connect_nats(url: str, timeout_s: float) -> Client:
    return await natsutil.connect(url, "tokenyard-bench", first_connect_timeout_s=timeout_s, kind="client")


_json_decode = msgspec.json.Decoder().decode
log = logging.getLogger("tokenyard.bench")


class HttpTarget:
    def __init__(self, base_url: str, model: str, concurrency: int | None, tenant: str | None = None):
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/v1/completions") else f"{url}/v1/completions"
        self.model = model
        self.tenant = tenant
        # One pooled session; no aiohttp timeout (the caller bounds each request).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency or 0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )

    def body(self, request: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "priority": request.priority,
            "ignore_eos": request.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.prompt is not None:
            body["prompt"] = request.prompt
        else:
            body["block_hashes"] = list(request.block_hashes or ())
            body["prompt_len"] = request.prompt_len
        if self.tenant:
            body["tenant"] = self.tenant
        if request.tpot_slo_ms is not None:
            body["tpot_slo_ms"] = request.tpot_slo_ms
        return body

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        data = msgspec.json.encode(self.body(request))
        record.send_s = perf_counter()
        async with self.session.post(
            self.url, data=data, headers={"Content-Type": "application/json", **tier_headers(request)}
        ) as resp:
            if resp.status != 200:
                record.end_s = perf_counter()
                record.fail(f"status_{resp.status}", _error_message(await resp.read()))
                return
            reader = SSEReader()
            async for raw in resp.content.iter_any():
                now = perf_counter()
                for payload in reader.feed(raw):
                    if record_sse_payload(payload, now, record):
                        return
            for payload in reader.close():
                if record_sse_payload(payload, perf_counter(), record):
                    return
            record.end_s = perf_counter()
            record.fail("incomplete_stream", "the SSE stream ended before [DONE]")

    async def close(self) -> None:
        await self.session.close()


def record_sse_payload(payload: str, now: float, record: RequestRecord) -> bool:
    """Fold one OpenAI completions SSE payload into `record`; True at `[DONE]` or an error frame."""
    if payload.strip() == "[DONE]":
        record.end_s = now
        return True
    try:
        obj = _json_decode(payload)
    except msgspec.DecodeError:
        record.end_s = now
        record.fail("bad_stream", f"not JSON: {payload[:200]!r}")
        return True
    if not isinstance(obj, dict):
        return False
    if err := obj.get("error"):
        record.end_s = now
        code = err.get("code") if isinstance(err, dict) else None
        record.fail(f"error_{code or 'stream'}", str(err.get("message") if isinstance(err, dict) else err))
        return True
    for choice in obj.get("choices") or ():
        text = choice.get("text")
        if text is None:  # a chat-shaped chunk
            text = (choice.get("delta") or {}).get("content")
        if not text and choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
            continue
        record.chunk_s.append(now)
        record.streamed_tokens += 1
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    if usage := obj.get("usage"):
        record.usage_completion_tokens = usage.get("completion_tokens")
        record.usage_prompt_tokens = usage.get("prompt_tokens")
    return False


def _error_message(body: bytes) -> str:
    try:
        obj = _json_decode(body)
        return str(obj["error"]["message"])
    except Exception:
        return body[:200].decode("utf-8", errors="replace")


async def open_target(
    url: str,
    model: str,
    request_timeout_s: float,
    concurrency: int | None,
    tenant: str | None,
    connect_timeout_s: float = 10.0,
) -> Target:
    if url.startswith(("http://", "https://")):
        return HttpTarget(url, model, concurrency, tenant)
    return await NatsTarget.connect(url, model, request_timeout_s, tenant, connect_timeout_s)
