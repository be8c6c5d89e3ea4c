"""End to end over a real nats-server: admission → queue → router → worker → client."""

from __future__ import annotations

from shared import schemas
from shared.client import TokenyardClient


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
