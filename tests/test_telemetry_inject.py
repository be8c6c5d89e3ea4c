"""What a hop passes on when spans are not recorded: the incoming trace context, and nothing
when none came in (no header block on the publish for the receiver to parse)."""

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
