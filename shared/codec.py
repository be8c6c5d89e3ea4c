"""Encoding on the wire: MessagePack by default; JSON for a message that arrives with header
`Content-Type: application/json`, answered in JSON, so a client in any language can publish.
Encoders and decoders are built once per type (msgspec's fast path)."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

import msgspec
from tokenyard.shared import schemas

T = TypeVar("T")

CONTENT_TYPE = "Content-Type"
JSON = "application/json"
MSGPACK = "application/msgpack"

_mp_enc = msgspec.msgpack.Encoder()
_js_enc = msgspec.json.Encoder()

DecodeError = (msgspec.DecodeError, msgspec.ValidationError)


@cache
def _mp_dec(t: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(t)


@cache
def _js_dec(t: Any) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(t)


def is_json(headers: dict[str, str] | None) -> bool:
    return bool(headers) and headers.get(CONTENT_TYPE, "").startswith(JSON)


def encode(obj: Any, json: bool = False) -> bytes:
    return _js_enc.encode(obj) if json else _mp_enc.encode(obj)


def decode(data: bytes, t: type[T], json: bool = False) -> T:
    """Decode and validate; raises msgspec.ValidationError / DecodeError on bad input, nesting
    too deep for the interpreter's stack included (msgspec skips an unknown field, or fills a
    `dict`, by recursing: `[[[…]]]` 100k deep would raise RecursionError)."""
    try:
        return (_js_dec(t) if json else _mp_dec(t)).decode(data)
    except RecursionError:
        raise msgspec.DecodeError("the message is nested too deeply") from None


def content_headers(json: bool) -> dict[str, str]:
    return {CONTENT_TYPE: JSON if json else MSGPACK}


_mp_event = _mp_dec(schemas.StreamEvent).decode
_js_event = _js_dec(schemas.StreamEvent).decode


def decode_event(data: bytes, headers: dict[str, str] | None = None) -> schemas.StreamEvent:
    """A stream event in whichever encoding it came in (JSON starts with `{`). Every token of
    every stream comes through here: the decoders are looked up once, not per call."""
    try:
        if data[:1] == b"{" or (headers and is_json(headers)):
            return _js_event(data)
        return _mp_event(data)
    except RecursionError:
        raise msgspec.DecodeError("the message is nested too deeply") from None
