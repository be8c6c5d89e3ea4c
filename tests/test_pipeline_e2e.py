"""End to end over a real nats-server: admission → queue → router → worker → client."""

from __future__ import annotations

import asyncio
import json

import pytest
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import start_inproc_fleet


async def test_stream_over_nats_in_order(fleet):
    client = TokenyardClient(fleet.nats)
    events = [e async for e in client.stream(schemas.GenerateRequest(prompt="Hello tokenyard", max_tokens=5))]
    assert isinstance(events[0], schemas.Accepted)
    assert events[0].prompt_tokens == len(b"Hello tokenyard")
    chunks = [e for e in events if isinstance(e, schemas.Chunk)]
    assert [c.seq for c in chunks] == [0, 1, 2, 3, 4]
    done = events[-1]
    assert isinstance(done, schemas.Finished)
    assert done.finish_reason == "length"
    assert done.usage == schemas.Usage(15, 5, 20, 0)
    assert done.seq == 5


async def queue_is_empty(fleet) -> bool:
    import json

    info = await fleet.nats.jetstream().stream_info("LLM_QUEUE")
    stats = json.loads((await fleet.nats.request("llm.v1.pq.stats", b"", timeout=2)).data)
    return info.state.messages == 0 and stats["depth"] == 0 and stats["in_flight"] == 0


@pytest.mark.parametrize(
    "body, status, code, param",
    [
        (b"\x93\x01\x02", 400, "invalid_request_error", None),  # msgpack, but not a request
        (schemas.GenerateRequest(prompt="hi", max_tokens=-3), 400, "invalid_value", "max_tokens"),
        (schemas.GenerateRequest(prompt="hi", model="no-such-model"), 404, "model_not_found", "model"),
        (schemas.GenerateRequest(prompt="x" * 40_000), 400, "context_length_exceeded", "prompt"),
        (schemas.GenerateRequest(), 400, "invalid_value", "prompt"),
        (schemas.GenerateRequest(prompt=[1, 2, 99999]), 400, "invalid_value", "prompt"),
    ],
)
async def test_bad_input_is_rejected_and_leaves_nothing_behind(fleet, body, status, code, param):
    inbox = fleet.nats.new_inbox()
    sub = await fleet.nats.subscribe(inbox)
    data = body if isinstance(body, bytes) else codec.encode(body)
    await fleet.nats.publish(subjects.SUBMIT, data, reply=inbox)
    event = codec.decode_event((await sub.next_msg(timeout=5)).data)
    assert isinstance(event, schemas.Rejected)
    assert (event.status, event.code, event.param) == (status, code, param)
    assert await queue_is_empty(fleet)


async def test_json_request_is_answered_in_json(fleet):
    inbox = fleet.nats.new_inbox()
    sub = await fleet.nats.subscribe(inbox)
    body = json.dumps({"model": "tokenyard-sim", "prompt": "hey", "max_tokens": 2}).encode()
    await fleet.nats.publish(subjects.SUBMIT, body, reply=inbox, headers={"Content-Type": "application/json"})
    types = []
    while True:
        msg = await sub.next_msg(timeout=5)
        event = json.loads(msg.data)  # plain JSON, readable by any client
        assert msg.headers["Content-Type"] == "application/json"
        types.append((event["type"], event.get("seq")))
        if event["type"] in ("finished", "rejected", "error"):
            break
    assert types == [("accepted", None), ("chunk", 0), ("chunk", 1), ("finished", 2)]


async def test_malformed_json_gets_a_clear_error(fleet):
    inbox = fleet.nats.new_inbox()
    sub = await fleet.nats.subscribe(inbox)
    await fleet.nats.publish(subjects.SUBMIT, b'{"prompt": 5}', reply=inbox, headers={"Content-Type": "application/json"})
    event = json.loads((await sub.next_msg(timeout=5)).data)
    assert event["type"] == "rejected" and event["status"] == 400
    assert "Expected `str | array | null`, got `int` - at `$.prompt`" in event["message"]


async def test_abort_stops_generation_on_the_worker(nats_server):
    fleet = await start_inproc_fleet(nats_server.url, workers=1, profile="a100-llama3-8b")
    try:
        client = TokenyardClient(fleet.nats)
        req = schemas.GenerateRequest(prompt="a long story", max_tokens=5000)
        events = []
        async for event in client.stream(req):
            events.append(event)
            if isinstance(event, schemas.Chunk) and event.seq == 2:
                await client.abort(req.request_id)
        assert isinstance(events[-1], schemas.Finished)
        assert events[-1].finish_reason == "abort"
        chunks = [e for e in events if isinstance(e, schemas.Chunk)]
        assert len(chunks) >= 3 and events[-1].usage.completion_tokens == sum(len(c.token_ids) for c in chunks)  # it stopped early
        engine = fleet.workers[0].shell.engine
        assert engine.stats().running == 0 and not engine.core.seqs
    finally:
        await fleet.stop()
        await fleet.nats.drain()


async def test_two_admission_replicas_share_the_load(fleet):
    from tokenyard.services.admission.core import AdmissionConfig
    from tokenyard.services.admission.shell import AdmissionShell
    from tokenyard.shared.tokenizer import ByteTokenizer

    second = await fleet.add(AdmissionShell(AdmissionConfig(), ByteTokenizer()))
    client = TokenyardClient(fleet.nats)
    done = await asyncio.gather(*(client.generate(schemas.GenerateRequest(prompt=f"p{i}", max_tokens=1)) for i in range(40)))
    assert all(c.finish_reason == "length" for c in done)
    handled = [h.service.stats().endpoints[0].num_requests for h in fleet.hosts if h.shell.kind == "admission"]
    assert second.shell.kind == "admission" and len(handled) == 2
    assert sum(handled) == 40 and min(handled) > 0
