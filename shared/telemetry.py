"""Tracing and logs, the same way in every service.

* One trace per request: W3C trace context (`traceparent`) travels in NATS headers; each hop
  extracts it, opens a span (OpenTelemetry messaging conventions: `messaging.system=nats`,
  `messaging.destination.name`, `messaging.operation.type`) and injects its own context into
  what it publishes next. Spans are recorded and exported over OTLP/HTTP when
  OTEL_EXPORTER_OTLP_ENDPOINT is set (or a test installed a provider). Otherwise a hop only
  passes the incoming context on (a non-recording span): an SDK span costs ~0.2 ms of
  Python, a third of a request's control-plane time on this path.
* structlog JSON logs; every line carries the current trace id, and the request id of the
  span it is logged in (one ContextVar set per span: structlog's `bound_contextvars` cost
  ~15 µs a span, four of them on each request's way to its worker).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind

_configured = False
_recording = False
"""True once an SDK tracer provider is installed: spans are recorded, attributes kept."""
_request_id: ContextVar[str | None] = ContextVar("tokenyard_request_id", default=None)
"""The request id of the span being run (`span(request_id=…)`), for the log lines inside it."""


def setup(service: str, level: str | None = None) -> None:
    """Install the tracer provider (unless a test installed one first) and structlog."""
    global _configured, _recording
    if _configured:
        return
    _configured = True
    exporting = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if exporting and not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": f"tokenyard-{service}"}))
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    _recording = isinstance(trace.get_tracer_provider(), TracerProvider)
    level_no = getattr(logging, (level or os.environ.get("TOKENYARD_LOG_LEVEL", "INFO")).upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_request_id,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_ids,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def recording() -> bool:
    """Whether spans are recorded: a hop that notes a timestamp for the profile (bench/hop_profile.py)
    does so only then."""
    return _recording


def add_request_id(_logger, _method, event: dict) -> dict:
    """structlog processor: the current span's request id on each log line (one given wins)."""
    if "request_id" not in event and (rid := _request_id.get()) is not None:
        event["request_id"] = rid
    return event


def add_trace_ids(_logger, _method, event: dict) -> dict:
    """structlog processor: the current span's trace and span ids on each log line."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def logger(service: str):
    return structlog.get_logger(service=service)


@cache
def tracer(service: str) -> trace.Tracer:
    return trace.get_tracer(f"tokenyard.{service}")


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Headers carrying the current trace context (plus any given). With spans not recorded
    and no context come in, there is none to carry: nothing is added (an empty result lets a
    publish go without a header block, which its receiver would parse)."""
    carrier = dict(headers or {})
    if _recording or trace.get_current_span().get_span_context().is_valid:
        propagate.inject(carrier)
    return carrier


def carrier_of(headers: dict[str, str] | None) -> dict[str, str]:
    """Only the trace-context headers, to keep with a request that waits (the queue)."""
    if not headers:
        return {}
    return {k: v for k, v in headers.items() if k in ("traceparent", "tracestate")}


@contextmanager
def span(
    service: str,
    operation: str,
    subject: str,
    headers: dict[str, str] | None = None,
    kind: SpanKind = SpanKind.CONSUMER,
    request_id: str | None = None,
    attributes: dict | None = None,
    end_on_exit: bool = True,
) -> Iterator[Span]:
    """A messaging span for one hop, child of the context in `headers` if any. When spans are
    not recorded, only the incoming context is passed on (so a downstream hop that does
    record still joins the trace) and no attributes are built. `end_on_exit=False`: the
    caller ends it (`.end()`), e.g. once work it handed to a task has an outcome."""
    parent = propagate.extract(headers) if headers and "traceparent" in headers else None
    token = otel_context.attach(parent) if parent is not None else None
    rid_token = _request_id.set(request_id) if request_id else None
    try:
        if not _recording:
            yield trace.get_current_span() if parent is not None else trace.INVALID_SPAN
            return
        attrs = {
            "messaging.system": "nats",
            "messaging.destination.name": subject,
            "messaging.operation.type": operation,
            "tokenyard.service": service,
        }
        if request_id:
            attrs["messaging.message.id"] = request_id
        if attributes:
            attrs.update(attributes)
        with tracer(service).start_as_current_span(f"{operation} {subject}", kind=kind, attributes=attrs,
                                                   end_on_exit=end_on_exit) as s:
            yield s
    finally:
        try:
            if rid_token is not None:
                _request_id.reset(rid_token)
        finally:
            if token is not None:
                otel_context.detach(token)
