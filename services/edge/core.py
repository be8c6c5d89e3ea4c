"""The edge's pure core: OpenAI HTTP bodies in, `GenerateRequest` out; stream events in,
OpenAI response objects out (shared.openai_api, which the worker's own HTTP front shares),
plus what only the edge does: which HTTP headers travel on to admission as NATS headers.
No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenyard.shared.openai_api import (  # noqa: F401  (the edge's API, re-exported)
    MAX_REQUEST_ID_LEN,
    NATS_HEADER_ROOM,
    SSE_DONE,
    ApiError,
    Endpoint,
    Renderer,
    error_from_event,
    error_type,
    model_card,
    models_list,
    outcome_for_status,
    parse_request,
    request_id_from,
    sse,
    usage_dict,
)

FORWARDED_HEADERS = ("x-request-tier", "x-tenant")
"""HTTP headers passed on as NATS headers to admission, which resolves tier and tenant."""
API_KEY_HEADER = "x-api-key"
"""The NATS header carrying the bearer token of `Authorization: Bearer <key>`."""


def nats_headers(http_headers: Mapping[str, str]) -> dict[str, str]:
    """The NATS headers the edge forwards for one HTTP request (names matched case-blind).
    Raises ApiError 431 when they, with the trace context, would not fit the room a NATS
    message keeps for headers (each HTTP header line may be 8 KiB)."""
    lowered = {k.lower(): v for k, v in http_headers.items()}
    out = {name: lowered[name] for name in FORWARDED_HEADERS if lowered.get(name)}
    scheme, _, key = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        out[API_KEY_HEADER] = key.strip()
    trace = sum(len(lowered.get(k, "")) for k in ("traceparent", "tracestate"))
    if trace + sum(len(k) + len(v) + 4 for k, v in out.items()) > NATS_HEADER_ROOM // 2:
        raise ApiError(431, "the request's headers are too large to send on", code="request_headers_too_large")
    return out
