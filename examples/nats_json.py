"""The NATS protocol with nothing but nats-py and JSON — what a client in any language does.

    .venv/bin/tokenyard up &
    .venv/bin/python examples/nats_json.py     # or: examples/nats_json.py nats://HOST:PORT

Subscribe to a fresh inbox, publish the request on `llm.v1.submit` with that inbox as the reply
subject and header `Content-Type: application/json`, then read the request's events from the
inbox until `finished`, `rejected` or `error`.
"""

from __future__ import annotations

import asyncio
import json
import sys

import nats


async def main(url: str = "nats://127.0.0.1:4222") -> None:
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    request = {"model": "tokenyard-sim", "prompt": "Hello", "max_tokens": 8}
    await nc.publish("llm.v1.submit", json.dumps(request).encode(), reply=inbox,
                     headers={"Content-Type": "application/json"})
    while True:
        msg = await sub.next_msg(timeout=60)
        if not msg.data:  # NATS's "no responders": no admission service is running
            print("no tokenyard fleet answers on", url)
            break
        event = json.loads(msg.data)
        print(event)
        if event["type"] in ("finished", "rejected", "error"):
            break
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
