"""Admission as its own process (`--admission separate`): a store whose ack is lost and whose
retries fail. The request may be in the stream, and run: its first chunk then carries the
acceptance (`Chunk.accepted`). The client must see one outcome: before, admission answered
`rejected` 503 ("nothing was queued") while the request ran; now it answers an `error` 503 and
aborts the request wherever its copy went, so no more tokens follow and nothing runs on.

Real nats-server, queue, router and a worker; the fault is admission's JetStream publish: its
first attempt stores the request and then raises the timeout a lost ack gives, and every
retry fails."""

from __future__ import annotations

import asyncio

from nats.errors import TimeoutError as NatsTimeout
from tokenyard.services.admission import shell as admission_shell
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.shared import schemas
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.fault_fleet import start_fleet, stop_fleet


async def test_a_store_whose_ack_was_lost_ends_the_stream_with_an_error_and_stops_the_request(nats_server, monkeypatch):
    hosts = await start_fleet(nats_server.url, workers=1)
    admission = next(h.shell for h in hosts if isinstance(h.shell, AdmissionShell))
    worker = hosts[0].shell
    stored = asyncio.Event()
    release = asyncio.Event()
    publish = admission.js.publish

    async def ack_lost(subject, data, timeout=None, headers=None, **kw):
        await publish(subject, data, timeout=timeout, headers=headers, **kw)  # it is stored ...
        stored.set()
        await release.wait()  # (held until the request runs: the chunk comes first)
        raise NatsTimeout  # ... and its ack is lost

    async def retries_fail(*args, **kw):
        raise NatsTimeout

    monkeypatch.setattr(admission.js, "publish", ack_lost)
    monkeypatch.setattr(admission_shell.natsutil, "publish_durably", retries_fail)
    client = await TokenyardClient.connect(nats_server.url)
    try:
        events = []
        async with asyncio.timeout(30):
            async for event in client.stream(schemas.GenerateRequest(prompt="lost ack", max_tokens=400)):
                events.append(event)
                if isinstance(event, schemas.Chunk):
                    release.set()  # the acceptance came with the first chunk: now the store "fails"
        kinds = [type(e).__name__ for e in events]
        # admission never answered `accepted` (its store had not returned): the client has it from
        # the first chunk (Chunk.accepted), and yields it first
        assert stored.is_set() and kinds[:2] == ["Accepted", "Chunk"] and events[1].accepted is not None, kinds
        assert "Rejected" not in kinds, kinds  # before: rejected 503 after the chunk-borne acceptance
        assert kinds[-1] == "Error" and events[-1].status == 503 and "may have been queued" in events[-1].message
        assert len([e for e in events if isinstance(e, schemas.Chunk)]) < 400  # it stopped early
        await until(lambda: not worker.generating, what="the request stopped on its worker")
    finally:
        await client.close()
        await stop_fleet(hosts)
