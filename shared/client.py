"""A small Python client for tokenyard over NATS.

    async with await TokenyardClient.connect("nats://127.0.0.1:4222") as client:
        async for event in client.stream(GenerateRequest(model="tokenyard-sim", prompt="Hi", max_tokens=8)):
            ...                                  # Accepted, Chunk…, then Finished (or Rejected / Error)
        result = await client.generate(GenerateRequest(prompt="Hi", max_tokens=8))
        await client.abort(request_id)

The protocol underneath, for clients in other languages: subscribe to an inbox, publish the
request on `llm.v1.submit` with that inbox as reply subject (MessagePack, or JSON with
header `Content-Type: application/json`), then read events tagged by `type` until one of
`rejected`, `finished`, `error`. Chunks carry `seq` 0, 1, 2 …; drop a seq seen before.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from nats.aio.client import Client
from tokenyard.shared import codec, nats_auth, natsutil, schemas, subjects, telemetry


@dataclass
class Completion:
    """What `generate` gathers from one stream."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: schemas.Usage | None = None
    accepted: schemas.Accepted | None = None
    rejected: schemas.Rejected | None = None
    error: schemas.Error | None = None
    worker_id: str = ""


class TokenyardClient:
    def __init__(self, nc: Client, owns_connection: bool = False):
        self.nc = nc
        self._owns = owns_connection

    @classmethod
    async def connect(cls, url: str, name: str = "tokenyard-client",
                      creds: nats_auth.Credentials | None = None) -> TokenyardClient:
        """Connect as a client (nats_auth: `client.creds`, or `TOKENYARD_NATS_CREDS`)."""
        return cls(await natsutil.connect(url, name, kind=nats_auth.CLIENT, creds=creds), owns_connection=True)

    async def close(self) -> None:
        if self._owns and not self.nc.is_closed:
            await self.nc.drain()

    async def __aenter__(self) -> TokenyardClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def stream(
        self,
        request: schemas.GenerateRequest,
        *,
        json: bool = False,
        headers: dict[str, str] | None = None,
        idle_timeout_s: float = 60.0,
        no_responders_retry_s: float = 2.0,
    ) -> AsyncIterator[schemas.StreamEvent]:
        """Submit and yield the request's events in order, ending with a terminal one. While no
        admission replica is subscribed (none runs, or the only one is reconnecting after its
        NATS node died) the submit is repeated for `no_responders_retry_s`, then answered 503:
        nothing received it, so a repeat cannot run it twice."""
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        inbox = self.nc.new_inbox()
        # A callback feeding a queue: far cheaper per message than sub.next_msg, which makes a
        # task and a timer for each one.
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver(msg) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(inbox, cb=deliver)
        try:
            hdrs = telemetry.inject({**(headers or {}), **codec.content_headers(json)})
            body = codec.encode(request, json=json)
            await self.nc.publish(subjects.SUBMIT, body, reply=inbox, headers=hdrs)
            next_seq = 0
            give_up = asyncio.get_running_loop().time() + no_responders_retry_s
            while True:
                async with asyncio.timeout(idle_timeout_s):
                    msg = await queue.get()
                if not msg.data and msg.headers and msg.headers.get("Status") == "503":
                    if asyncio.get_running_loop().time() < give_up:
                        await asyncio.sleep(0.1)
                        await self.nc.publish(subjects.SUBMIT, body, reply=inbox, headers=hdrs)
                        continue
                    yield schemas.Rejected(request.request_id, 503, "no_responders", "no admission service is running")
                    return
                event = codec.decode_event(msg.data, msg.headers)
                if isinstance(event, schemas.Chunk):
                    if event.seq < next_seq:
                        continue  # a duplicate (redelivery after a migration)
                    next_seq = event.seq + 1
                yield event
                if isinstance(event, schemas.TERMINAL_EVENTS):
                    return
        except asyncio.CancelledError:
            await self.abort(request.request_id, reason="client_cancelled")
            raise
        finally:
            await sub.unsubscribe()

    async def generate(self, request: schemas.GenerateRequest, **kwargs) -> Completion:
        """Submit and wait for the whole completion."""
        out = Completion(request_id=request.request_id or "")
        parts: list[str] = []
        async for event in self.stream(request, **kwargs):
            out.request_id = event.request_id
            match event:
                case schemas.Accepted():
                    out.accepted = event
                case schemas.Chunk():
                    parts.append(event.text)
                    out.token_ids.extend(event.token_ids)
                case schemas.Finished():
                    out.finish_reason, out.usage, out.worker_id = event.finish_reason, event.usage, event.worker_id
                case schemas.Rejected():
                    out.rejected = event
                case schemas.Error():
                    out.error = event
        out.text = "".join(parts)
        return out

    async def abort(self, request_id: str, reason: str = "client") -> None:
        await self.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(request_id=request_id, reason=reason)))
        await self.nc.flush()
