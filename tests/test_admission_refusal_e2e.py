"""Over a real nats-server: admission reads the queue's state from `llm.v1.pq.state` and
refuses a request whose class would miss its TTFT target with a 503 carrying Retry-After
and the queue depth; nothing reaches the JetStream queue."""

from __future__ import annotations

from nats.errors import NoRespondersError
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

SATURATED = schemas.QueueStats(
    instance_id="pq-test", ts=0.0, policy="hybrid", depth=[0, 40, 0, 0], work_tokens=[0, 80_000, 0, 0],
    drain_tokens_per_s=10_000.0, headroom=0,
)


async def ask(nc, body: schemas.GenerateRequest, headers=None):
    reply = await nc.request(subjects.SUBMIT, codec.encode(body), timeout=5, headers=headers)
    return codec.decode_event(reply.data)


async def test_a_saturated_fleet_gets_a_503_and_nothing_is_queued(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-admission-refusal")
    await natsutil.ensure_queue_stream(nc)
    js = nc.jetstream()
    await js.purge_stream(subjects.QUEUE_STREAM)
    host = await ServiceHost(AdmissionShell(AdmissionConfig(), ByteTokenizer()), nats_server.url).start()
    try:
        # A probe whose prompt is out of the vocabulary is refused either way, leaving nothing:
        # 400 until admission has the queue state, then 503 (feasibility comes first).
        probe = schemas.GenerateRequest(prompt=[1, 10**9], max_tokens=4)
        for _ in range(200):
            await nc.publish(subjects.QUEUE_STATE, codec.encode(SATURATED))
            try:
                event = await ask(nc, probe)
            except NoRespondersError:  # the endpoint's subscription has not reached the server yet
                continue
            if event.status == 503:
                break
        assert event.status == 503
        queued = await nc.subscribe(subjects.QUEUE)  # sees every publish to the JetStream queue
        event = await ask(nc, schemas.GenerateRequest(prompt="hello", max_tokens=4, request_id="r1"))
        assert isinstance(event, schemas.Rejected)
        assert (event.request_id, event.status, event.code) == ("r1", 503, "overloaded")
        assert (event.retry_after_s, event.queue_depth) == (3.25, 40)  # 80 000 / 10 000 = 8 s + 0.25 s vs 5 s
        # P2's 60 s target still fits: admitted and queued
        event = await ask(nc, schemas.GenerateRequest(prompt="hello", max_tokens=4, priority=2, request_id="r2"))
        assert isinstance(event, schemas.Accepted) and event.priority == 2
        # admission publishes in order on one connection: had r1 been queued, it came first
        first = codec.decode((await queued.next_msg(timeout=5)).data, schemas.AdmittedRequest)
        assert first.request_id == "r2"
    finally:
        await host.stop()
        await js.purge_stream(subjects.QUEUE_STREAM)
        await nc.drain()
