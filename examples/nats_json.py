"""The NATS protocol with nothing but nats-py and JSON — what a client in any language does.

    .venv/bin/tokenyard up &                   # leaves the client's creds where this finds them
    .venv/bin/python examples/nats_json.py     # or: examples/nats_json.py nats://HOST:PORT [CREDS]

NATS is secured by default (docs/security.md): a client logs in with the `client` user's name and
password from the creds file (TOML) and keeps its inbox under `_INBOX.<user>`, the only inbox
it may read. Subscribe to a fresh inbox, publish the request on `llm.v1.submit` with that inbox as the reply
subject and header `Content-Type: application/json`, then read the request's events from the
inbox until `finished`, `rejected` or `error`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib

import nats


def login(url: str, creds_file: str | None) -> dict:
    """nats.connect options from a creds file (`user = "…"`, `password = "…"`): the one given,
    else $TOKENYARD_NATS_CREDS, else the copy `tokenyard up` leaves for a fleet on this machine
    ($XDG_RUNTIME_DIR or ~/.cache, then tokenyard/nats-<port>/client.creds); none: anonymous."""
    port = url.rsplit(":", 1)[-1]
    local = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or os.path.expanduser("~/.cache"),
                         "tokenyard", f"nats-{port}", "client.creds")
    creds_file = creds_file or os.environ.get("TOKENYARD_NATS_CREDS") or (local if os.path.exists(local) else None)
    if not creds_file:
        return {}
    with open(creds_file, "rb") as f:
        creds = tomllib.load(f)
    return {"user": creds["user"], "password": creds["password"], "inbox_prefix": f"_INBOX.{creds['user']}"}


async def main(url: str = "nats://127.0.0.1:4222", creds_file: str | None = None) -> None:
    async def quiet(_error: Exception) -> None:  # nats-py would print every failed attempt
        pass

    try:  # nats-py retries an unreachable server for minutes: bound the first connection
        nc = await asyncio.wait_for(nats.connect(url, error_cb=quiet, **login(url, creds_file)), 10)
    except (TimeoutError, OSError) as exc:
        sys.exit(f"cannot reach NATS at {url} ({type(exc).__name__}); start a fleet: .venv/bin/tokenyard up")
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
