"""Admission's span of a request records what JetStream made of it, after the publish: a
request stored is `admitted`, a reused id `duplicate`, one JetStream would not store
`admit_failed` (it said `admitted` at the decision, before the publish, whatever came of it).
A real nats-server of the module's own whose queue stream holds one message (nothing consumes
it), so the second request's publish is refused."""

from __future__ import annotations

import time

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import hb
from tests.conftest import until


async def test_the_outcome_on_admissions_span_is_what_jetstream_made_of_the_request(plain_nats, spans, monkeypatch):
    monkeypatch.setenv("TOKENYARD_QUEUE_MAX_MSGS", "1")
    host = await ServiceHost(AdmissionShell(AdmissionConfig(), ByteTokenizer()), plain_nats.url).start()
    nc = await natsutil.connect(plain_nats.url, "admission-span-test")
    try:
        await nc.publish(subjects.heartbeat("w0"), codec.encode(hb("w0", model=config.DEFAULT_MODEL, ts=time.time())))
        await until(lambda: "w0" in host.shell.core.fleet.workers)
        spans.clear()

        async def submit(rid: str):
            reply = await nc.request(subjects.SUBMIT, codec.encode(schemas.GenerateRequest(
                model=config.DEFAULT_MODEL, prompt="hello", max_tokens=4, request_id=rid)), timeout=10)
            return codec.decode_event(reply.data, reply.headers)

        first, again, second = await submit("span-a"), await submit("span-a"), await submit("span-b")
        assert isinstance(first, schemas.Accepted)
        assert isinstance(again, schemas.Rejected) and again.status == 409
        assert isinstance(second, schemas.Rejected) and (second.status, second.code) == (503, "queue_unavailable")

        def outcomes():
            got = [(s.attributes["messaging.message.id"], s.attributes.get("tokenyard.outcome"))
                   for s in spans.get_finished_spans()
                   if s.attributes.get("tokenyard.service") == "admission" and s.name.startswith("process")]
            return got if len(got) == 3 else None

        assert await until(outcomes, what="three admission spans") == [
            ("span-a", "admitted"), ("span-a", "duplicate"), ("span-b", "admit_failed")]
    finally:
        await nc.drain()
        await host.stop()
