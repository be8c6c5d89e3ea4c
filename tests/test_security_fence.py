"""The router's migration fence, an abort with reason `migrated`, silences a stream while its
request lives on (the router runs it elsewhere). On `llm.v1.abort`, where any client may
publish, a forged one held another client's stream silent until a router re-issued it (~9.5 s).
The fence has its own subject, `llm.v1.fence`, that only routers may publish on; a worker
drops a `migrated` abort that comes on `llm.v1.abort`."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import start_inproc_fleet

TOKENS = 120


@pytest.fixture
async def timed_fleet(nats_server):
    """Two workers at an A100's decode speed: a stream of TOKENS lasts about a second."""
    f = await start_inproc_fleet(nats_server.url, profile="a100-llama3-8b")
    yield f
    await f.stop()
    await f.nats.drain()


async def test_a_client_cannot_silence_another_clients_stream(nats_server, timed_fleet):
    rid = f"victim-{uuid.uuid4().hex[:8]}"
    mallory = await nats.connect(nats_server.url, name="mallory", allow_reconnect=False,
                                 **nats_server.auth.credentials("alice").connect_options())
    forged = codec.encode(schemas.Abort(rid, reason=schemas.MIGRATED))
    arrivals: list[float] = []
    try:
        async with await TokenyardClient.connect(nats_server.url, "bob", creds=nats_server.auth.credentials("bob")) as bob:
            request = schemas.GenerateRequest(prompt="a stream to silence", max_tokens=TOKENS, request_id=rid,
                                              ignore_eos=True)
            async with asyncio.timeout(30):
                async for events in bob.stream_batches(request):
                    for event in events:
                        if type(event) is schemas.Chunk:
                            if not arrivals:  # running on its worker: forge the fence both ways
                                await mallory.publish(subjects.ABORT, forged)
                                await mallory.publish(subjects.FENCE, forged)  # refused by the server
                                await mallory.flush()
                            arrivals.append(time.monotonic())
                        elif isinstance(event, schemas.TERMINAL_EVENTS):
                            done = event
    finally:
        await mallory.close()
    assert type(done) is schemas.Finished and done.usage.completion_tokens == TOKENS
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert max(gaps) < 1.0, f"the stream went silent for {max(gaps):.2f} s"


async def test_the_routers_fence_still_silences_a_generation(nats_server, timed_fleet):
    """The router's own fence, on `llm.v1.fence`, still reaches the worker: the stream it fenced
    sends nothing more (its request would run on the worker the router re-issued it to)."""
    rid = f"fenced-{uuid.uuid4().hex[:8]}"
    chunks = 0
    router_nc = next(h.nc for h in timed_fleet.hosts if h.shell.kind == "router")
    async with await TokenyardClient.connect(nats_server.url, "bob", creds=nats_server.auth.credentials("bob")) as bob:
        request = schemas.GenerateRequest(prompt="a stream to fence", max_tokens=TOKENS, request_id=rid,
                                          ignore_eos=True)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(3):
                async for events in bob.stream_batches(request):
                    for event in events:
                        if type(event) is schemas.Chunk:
                            if chunks == 0:
                                await router_nc.publish(subjects.FENCE, codec.encode(
                                    schemas.Abort(rid, reason=schemas.MIGRATED)))
                                await router_nc.flush()
                            chunks += len(event.token_ids)
                        assert not isinstance(event, schemas.TERMINAL_EVENTS), event
    assert 0 < chunks < TOKENS // 2
