"""OpenAI's HTTP API as tokenyard speaks it, shared by every HTTP front (the edge, and a
worker's own `--http` front, which serves straight from its engine as `vllm serve` does):
bodies in, `GenerateRequest` out; stream events in, OpenAI response objects out. No I/O, no
clock (`created` comes in as an argument).

    body ──parse_request──> GenerateRequest            (or ApiError: status, type, param, code)
           (the endpoint's rules, then shared.validation.check, admission's own rules)
    Accepted, Chunk…, Finished ──Renderer──> SSE frames  `data: {chunk}\\n\\n` … `data: [DONE]\\n\\n`
                                          or one response object (non-streaming)
    Rejected / Error ──error_from_event──> ApiError ──> `{"error": {message, type, param, code}}`

Chunks mirror OpenAI's: `text_completion` objects with `choices[0].text` for completions;
`chat.completion.chunk` objects with `choices[0].delta` for chat, the first delta carrying
`role: assistant`; a last choice chunk with an empty text/delta and `finish_reason`; with
`stream_options.include_usage`, every chunk has `usage: null` and one more chunk with
`choices: []` and the usage precedes `[DONE]`. An error after the SSE headers went out
travels as a `data: {"error": …}` frame (what OpenAI's client raises from), then `[DONE]`.
Usage carries `prompt_tokens_details.cached_tokens` (prefix-cache hits), as vLLM reports it.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any

import msgspec
from tokenyard.shared import codec, config, schemas, validation
from tokenyard.shared.schemas import Outcome

SSE_DONE = b"data: [DONE]\n\n"


class Endpoint(enum.StrEnum):
    """The two generation routes; the value doubles as the metric label."""

    COMPLETIONS = "completions"
    CHAT = "chat_completions"


# ───────────────────────────── errors ─────────────────────────────


class ApiError(Exception):
    """An OpenAI error answer: HTTP status plus the body's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or error_type(status)
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def error_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return msgspec.json.encode(self.error_dict())

    def headers(self) -> dict[str, str]:
        """`Retry-After` in whole seconds (HTTP's delta-seconds), rounded up."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(0, math.ceil(self.retry_after_s)))}

    def outcome(self) -> Outcome:
        return outcome_for_status(self.status)


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


_DEFAULT_CODE = {
    404: "model_not_found",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    503: "overloaded",
}


def outcome_for_status(status: int) -> Outcome:
    if status == 429:
        return Outcome.REJECTED_RATE
    if status == 503:
        return Outcome.REJECTED_CAPACITY
    if 400 <= status < 500:
        return Outcome.REJECTED_INVALID
    return Outcome.FAILED


def error_from_event(event: schemas.Rejected | schemas.Error) -> ApiError:
    if isinstance(event, schemas.Rejected):
        return ApiError(
            event.status,
            event.message,
            param=event.param,
            code=event.code or _DEFAULT_CODE.get(event.status),
            retry_after_s=event.retry_after_s,
        )
    return ApiError(event.status, event.message, code=_DEFAULT_CODE.get(event.status))


# ───────────────────────────── requests ─────────────────────────────

_PATH = re.compile(r" - at `\$\.?(.*)`$")
NATS_HEADER_ROOM = 8 * 1024
"""Bytes of a NATS message kept for headers (trace context, tier, tenant, API key); the
request's MessagePack form may take the rest of the server's max payload."""
NATS_HEADROOM_BYTES = 2 * NATS_HEADER_ROOM
"""A body may take the max payload less this: the header room, and as much again for what
the edge adds to the body (model, request id: well under 1 KiB)."""


def body_limit(max_payload: int) -> int:
    """The largest HTTP body a front accepts when its requests travel in NATS messages of at
    most `max_payload` bytes. MessagePack never takes more bytes than the JSON it came from,
    so with NATS_HEADROOM_BYTES to spare every body within the limit fits; the encoded
    request is checked again all the same (`parse_request`)."""
    return max(1024, max_payload - NATS_HEADROOM_BYTES)


def parse_request(
    body: bytes,
    endpoint: Endpoint,
    models: list[str],
    request_id: str,
    *,
    max_model_len: int = config.MAX_MODEL_LEN,
    max_payload: int | None = None,
) -> schemas.GenerateRequest:
    """Decode and check one HTTP body; raise ApiError (400 / 404 / 413) on anything wrong.

    The endpoint's own rules (chat takes `messages`, completions `prompt`; stream_options
    only with stream), then shared.validation.check, the rules admission applies to every
    request, so what the edge forwards is never refused there for its shape. A missing
    `model` means the first served one (vLLM's behaviour); `models == []` serves any name.
    With `max_payload`, a request whose MessagePack form would not fit a NATS message is a
    413 here rather than a failed publish."""
    try:
        req = codec.decode(body, schemas.GenerateRequest, json=True)
    except msgspec.ValidationError as e:
        text = str(e)
        m = _PATH.search(text)
        param = (m.group(1) or None) if m else None
        out_of_range = any(op in text for op in (" <= ", " >= ", " < ", " > "))  # "Expected `int` <= 2^63-1"
        code = "invalid_type" if text.startswith("Expected") and not out_of_range else "invalid_value"
        raise ApiError(400, text, param=param, code=code) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"The request body is not valid JSON: {e}", code="invalid_json") from None

    if endpoint is Endpoint.CHAT:
        if req.prompt is not None:
            raise ApiError(400, "`prompt` is for /v1/completions; chat takes `messages`", param="prompt")
        if not req.messages:
            raise ApiError(
                400,
                "`messages` must be a non-empty list",
                param="messages",
                code="missing_required_parameter",
            )
    else:
        if req.messages is not None:
            raise ApiError(
                400, "`messages` is for /v1/chat/completions; completions take `prompt`", param="messages"
            )
        if req.prompt is None and req.block_hashes is None:
            raise ApiError(400, "`prompt` is required", param="prompt", code="missing_required_parameter")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "`stream_options` is only allowed when `stream` is true", param="stream_options")
    req.request_id = request_id
    checked = validation.check(req, validation.Limits(models=tuple(models), max_model_len=max_model_len))
    if isinstance(checked, validation.Invalid):
        raise api_error(checked)
    req.model = checked.model
    if max_payload is not None:
        _check_encodable(req, max_payload)
    return req


def _check_encodable(req: schemas.GenerateRequest, max_payload: int) -> None:
    try:
        size = len(codec.encode(req))
    except (OverflowError, TypeError, ValueError) as e:  # a value MessagePack cannot carry
        raise ApiError(400, f"the request holds a value that cannot be sent on: {e}", code="invalid_value") from None
    if size > max_payload - NATS_HEADER_ROOM:
        raise ApiError(413, f"the request is {size} bytes encoded; at most {max_payload - NATS_HEADER_ROOM} "
                            "fit a message of the fleet's bus", code="request_too_large")


def api_error(invalid: validation.Invalid) -> ApiError:
    return ApiError(invalid.status, invalid.message, param=invalid.param, code=invalid.code)


MAX_REQUEST_ID_LEN = 128


def request_id_from(header: str | None, fresh: str) -> str:
    """The client's `x-request-id` when it gave a sane one (admission's rule), else `fresh`."""
    if not header:
        return fresh
    if not validation.REQUEST_ID.match(header):
        raise ApiError(
            400,
            f"`x-request-id` must be {validation.REQUEST_ID_RULE}",
            param="x-request-id",
            code="invalid_value",
        )
    return header


# ───────────────────────────── responses ─────────────────────────────


def usage_dict(usage: schemas.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


_json_encode = msgspec.json.Encoder().encode


def sse(obj: Any) -> bytes:
    return b"data: " + _json_encode(obj) + b"\n\n"


_MARK = "\x00"


def _split_at(frame: bytes, key: bytes) -> tuple[bytes, bytes]:
    """`frame` around the value of its field `key`, the string _MARK: (up to and with the key,
    after the value)."""
    field = key + _json_encode(_MARK)
    at = frame.rindex(field)
    return frame[: at + len(key)], frame[at + len(field):]


def models_list(models: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(m, created) for m in models]}


def model_card(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "tokenyard"}


class Renderer:
    """Turns one request's events into OpenAI objects. Stateful only in what OpenAI's format
    needs remembered: whether chat's `role` went out, and (non-streaming) the text so far."""

    def __init__(self, endpoint: Endpoint, request: schemas.GenerateRequest, created: int):
        self.endpoint = endpoint
        self.chat = endpoint is Endpoint.CHAT
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{request.request_id}"
        self.model = request.model
        self.created = created
        self.include_usage = bool(
            request.stream and request.stream_options and request.stream_options.include_usage
        )
        self._role_sent = False
        self._parts: list[str] = []
        self.finished: schemas.Finished | None = None
        # A text chunk's frame is the same bytes each time but for the text: encode the rest
        # once (a chunk whose text is a marker, split around it) and only the text per token.
        # The split point, `"text":"` / `"content":"` unescaped, can only be the field's own
        # (a quote inside a string, the id or the model, is escaped).
        self._role_sent = True  # the template is a chunk after the first
        key = b'"content":' if self.chat else b'"text":'
        self._head, self._tail = _split_at(sse(self._chunk(_MARK, None)), key)
        self._role_sent = False

    # streaming

    def render(self, events: list[schemas.StreamEvent]) -> bytes:
        """The SSE bytes for several events in order (`frames` of each, joined)."""
        out: list[bytes] = []
        for event in events:
            if type(event) is schemas.Chunk and event.text and (self._role_sent or not self.chat):
                out.append(self._head + _json_encode(event.text) + self._tail)
            else:
                out.extend(self.frames(event))
        return b"".join(out)

    def frames(self, event: schemas.StreamEvent) -> list[bytes]:
        """The SSE frames for one event; a terminal event's frames end with `[DONE]`."""
        match event:
            case schemas.Accepted():
                return [sse(self._chunk(None, None))] if self.chat else []
            case schemas.Chunk():
                return [sse(self._chunk(event.text, None))]
            case schemas.Finished():
                self.finished = event
                out = [sse(self._chunk("", event.finish_reason))]
                if self.include_usage:
                    out.append(sse(self._envelope([], usage=usage_dict(event.usage))))
                return [*out, SSE_DONE]
            case schemas.Rejected() | schemas.Error():
                return [sse(error_from_event(event).error_dict()), SSE_DONE]
        raise TypeError(f"not a stream event: {event!r}")

    def _chunk(self, text: str | None, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {}
            if not self._role_sent:
                delta["role"] = "assistant"
                self._role_sent = True
                delta["content"] = text or ""
            elif text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope([choice], usage=None)

    def _envelope(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            obj["usage"] = usage
        return obj

    # non-streaming

    def feed(self, event: schemas.StreamEvent) -> None:
        """Gather one event for `response()`; Rejected / Error raise their ApiError."""
        match event:
            case schemas.Chunk():
                self._parts.append(event.text)
            case schemas.Finished():
                self.finished = event
            case schemas.Rejected() | schemas.Error():
                raise error_from_event(event)

    def response(self) -> dict[str, Any]:
        """The whole response object, once `feed` has seen Finished."""
        assert self.finished is not None, "response() before Finished"
        text = "".join(self._parts)
        reason = self.finished.finish_reason
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_dict(self.finished.usage),
        }
