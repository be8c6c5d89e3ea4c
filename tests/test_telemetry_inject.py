"""What a hop passes on when spans are not recorded: the incoming trace context, and nothing
when none came in (no header block on the publish for the receiver to parse). Spans on or off
is decided once per process (telemetry.setup, from the tracer provider); the tests set its
module switch `_recording` to run both ways in one process."""

from __future__ import annotations

from tokenyard.shared import telemetry

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_with_spans_off_and_no_context_nothing_is_injected(monkeypatch):
    monkeypatch.setattr(telemetry, "_recording", False)
    assert telemetry.inject() == {}
    assert telemetry.inject({"Nats-Msg-Id": "r1"}) == {"Nats-Msg-Id": "r1"}
    with telemetry.span("queue", "process", "llm.v1.queue", headers={}):
        assert telemetry.inject() == {}


def test_with_spans_off_an_incoming_context_is_passed_on(monkeypatch):
    monkeypatch.setattr(telemetry, "_recording", False)
    with telemetry.span("queue", "process", "llm.v1.queue", headers={"traceparent": PARENT}):
        out = telemetry.inject()
    assert out["traceparent"].split("-")[1] == PARENT.split("-")[1]  # the same trace


def test_a_log_line_inside_a_span_carries_its_request_id_and_one_outside_does_not(monkeypatch):
    for recording in (False, True):
        monkeypatch.setattr(telemetry, "_recording", recording)
        line = telemetry.add_request_id
        with telemetry.span("router", "process", "llm.v1.route", request_id="r1"):
            assert line(None, "info", {"event": "x"}) == {"event": "x", "request_id": "r1"}
            with telemetry.span("router", "send", "llm.v1.worker.w0.generate", request_id="r2"):
                assert line(None, "info", {})["request_id"] == "r2"
            assert line(None, "info", {})["request_id"] == "r1"  # the inner span's ended: the outer's again
            assert line(None, "info", {"request_id": "own"})["request_id"] == "own"  # one given explicitly wins
        assert line(None, "info", {}) == {}


class Boom(Exception):
    pass


def test_a_span_left_by_an_exception_gives_back_the_request_id_and_trace_context_it_replaced(monkeypatch):
    """Both cleanups run when the body raises (they are nested, so one failing cannot skip the
    other): the log lines after it carry the outer span's request id again, and what is
    injected next belongs to the outer trace, not the failed span's."""
    from opentelemetry import trace

    line = telemetry.add_request_id
    inner = "00-11111111111111111111111111111111-2222222222222222-01"
    for recording in (False, True):
        monkeypatch.setattr(telemetry, "_recording", recording)
        with telemetry.span("queue", "process", "llm.v1.queue", {"traceparent": PARENT}, request_id="outer"):
            outer_span = trace.get_current_span()
            try:
                with telemetry.span("router", "process", "llm.v1.route", {"traceparent": inner}, request_id="inner"):
                    assert line(None, "info", {})["request_id"] == "inner"
                    assert telemetry.inject()["traceparent"].split("-")[1] == "1" * 32
                    raise Boom
            except Boom:
                pass
            assert line(None, "info", {})["request_id"] == "outer"
            assert trace.get_current_span() is outer_span
            assert telemetry.inject()["traceparent"].split("-")[1] == PARENT.split("-")[1]
        assert line(None, "info", {}) == {}
        assert telemetry.inject() == {}  # no context left behind
