"""One trace per request: edge → admission → queue → router → worker under one trace id,
with messaging attributes on every hop and GenAI attributes on the worker's span."""

from __future__ import annotations

from opentelemetry.trace import SpanKind
from tokenyard.shared import schemas, subjects, telemetry
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until


async def test_one_trace_from_client_to_worker(fleet, spans):
    spans.clear()
    client = TokenyardClient(fleet.nats)
    with telemetry.span("edge", "publish", subjects.SUBMIT, kind=SpanKind.PRODUCER) as root:
        completion = await client.generate(schemas.GenerateRequest(prompt="trace me please", max_tokens=3))
    trace_id = root.get_span_context().trace_id
    assert completion.finish_reason == "length"

    # The client can have its last token before the queue's span (closed once the router
    # answered) ends: wait for every hop's consumer span to be exported.
    want = {"edge", "admission", "queue", "router", "worker"}
    def every_consumer_span():
        mine = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
        return mine if {s.attributes["tokenyard.service"] for s in mine if s.kind == SpanKind.CONSUMER} >= want - {"edge"} else None

    mine = await until(every_consumer_span, timeout_s=5)
    hops = {s.attributes["tokenyard.service"] for s in mine}
    assert hops == want
    by_service = {s.attributes["tokenyard.service"]: s for s in mine if s.kind == SpanKind.CONSUMER}
    worker = by_service["worker"]
    assert worker.attributes["gen_ai.request.model"] == "tokenyard-sim"
    assert worker.attributes["gen_ai.usage.input_tokens"] == len("trace me please")
    assert worker.attributes["gen_ai.usage.output_tokens"] == 3
    # seconds, measured inside the worker's span: within it (in ms it would exceed it)
    assert 0 <= worker.attributes["gen_ai.server.time_to_first_token"] <= (worker.end_time - worker.start_time) / 1e9
    assert by_service["admission"].attributes["messaging.destination.name"] == subjects.SUBMIT
    assert by_service["admission"].attributes["messaging.system"] == "nats"
    # Each hop's span is a descendant of the one before it.
    ids = {s.context.span_id: s for s in mine}

    def ancestors(s):
        while s.parent is not None and s.parent.span_id in ids:
            s = ids[s.parent.span_id]
            yield s.attributes["tokenyard.service"]

    assert set(ancestors(worker)) >= {"router", "queue", "admission", "edge"}


async def test_the_hops_note_the_first_tokens_path_in_causal_order(fleet, spans):
    """The instants bench/hop_profile.py cuts a TTFT at, one request's, in the order the first
    token's path passes them: admission's publish to JetStream, the queue's receipt, its route
    request, the router's decision and offer, the worker's receipt and its first chunk."""
    spans.clear()
    client = TokenyardClient(fleet.nats)
    with telemetry.span("edge", "publish", subjects.SUBMIT, kind=SpanKind.PRODUCER) as root:
        await client.generate(schemas.GenerateRequest(prompt="profile me", max_tokens=2))
    trace_id = root.get_span_context().trace_id

    def named(service: str, prefix: str):
        return next((s for s in spans.get_finished_spans() if s.context.trace_id == trace_id
                     and s.attributes["tokenyard.service"] == service and s.name.startswith(prefix)), None)

    wanted = [("admission", "process"), ("queue", "process"), ("queue", "send llm.v1.route"),
              ("router", "process"), ("router", "send llm.v1.worker."), ("worker", "process")]
    adm, queue, route, router, offer, worker = await until(
        lambda: (found if None not in (found := [named(*w) for w in wanted]) else None), timeout_s=5)
    path = [adm.start_time, adm.attributes["tokenyard.enqueue_ns"], queue.attributes["tokenyard.received_ns"],
            route.start_time, router.start_time, offer.start_time, worker.attributes["tokenyard.received_ns"],
            worker.attributes["tokenyard.first_event_ns"]]
    assert path == sorted(path)
    assert worker.attributes["tokenyard.first_event_ns"] < worker.end_time
