"""tokenyard's Python client over NATS: stream one completion, gather a whole one, cancel one.

    .venv/bin/tokenyard up &                   # a fleet, NATS on 4222
    .venv/bin/python examples/client.py        # or: examples/client.py nats://HOST:PORT
"""

from __future__ import annotations

import asyncio
import sys

from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.schemas import Chunk, Finished, GenerateRequest


async def main(url: str = "nats://127.0.0.1:4222") -> None:
    async with await TokenyardClient.connect(url) as client:
        # 1. Stream: events arrive in order — accepted, chunks numbered by seq, then finished.
        async for event in client.stream(GenerateRequest(prompt="Hello", max_tokens=8)):
            if isinstance(event, Chunk):
                print(event.text, end="", flush=True)
            elif isinstance(event, Finished):
                print(f"\n[{event.finish_reason}: {event.usage.completion_tokens} tokens, worker {event.worker_id}]")

        # 2. The whole completion at once.
        result = await client.generate(GenerateRequest(prompt="Hi", max_tokens=8))
        print(f"generate: {result.text!r} ({result.finish_reason})")

        # 3. Cancel a request part-way (llm.v1.abort): its worker stops and frees its memory.
        request = GenerateRequest(prompt="A long story", max_tokens=1000)
        async for event in client.stream(request):  # stream() gives the request an id
            if isinstance(event, Chunk) and event.seq == 2:
                await client.abort(request.request_id)
            elif isinstance(event, Finished):
                print(f"aborted: {event.finish_reason} after {event.usage.completion_tokens} tokens")


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:]))
    except ConnectionError as exc:  # no NATS at the URL: one line, not a traceback
        sys.exit(f"{exc}; start a fleet: .venv/bin/tokenyard up")
