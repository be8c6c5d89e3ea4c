"""Reading streams for the fault probes, three ways, each tallied the same:

* raw: the probe's own inbox on NATS, no client-side repair (what a naive NATS client sees);
* TokenyardClient: repeats dropped, gaps held for the replay, lost ends turned into errors;
* HTTP: OpenAI SSE through the edge (which reads NATS with TokenyardClient). SSE carries no
  seqs, so a hole is a stream that ends normally with fewer tokens than asked (the simulated
  engine's tokens are ASCII bytes: one byte of text per token) and a repeat one with more.

Outcomes: completed (finished, every token, no gap) · failed_clean (an error or rejection) ·
hung (no terminal event by the deadline) · silent_short (a normal end after a hole: what a
client would take as complete). `duplicated` counts chunks whose seq came twice (the protocol
tells receivers to drop them), `gaps` streams with a hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from nats.aio.client import Client
from tokenyard.loadgen.sse import SSEReader
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient


@dataclass
class Stream:
    request_id: str
    max_tokens: int
    seqs: list[int] = field(default_factory=list)
    tokens: int = 0
    dup: int = 0
    seen: set[int] = field(default_factory=set)
    reordered: bool = False
    """A seq came before a smaller one (a hole, possibly filled later by a replay)."""
    accepted: bool = False
    terminal: str = ""
    """finished / error / rejected; '' = none yet."""
    status: int = 0
    finished_seq: int = -1
    worker_id: str = ""
    message: str = ""
    end_s: float = 0.0
    after_end: int = 0
    """Chunks and ends that came after the stream's terminal event (a second placement of a
    request that finished shows only here)."""
    first_chunk: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def on_event(self, e: schemas.StreamEvent) -> None:
        if self.terminal:
            if isinstance(e, schemas.Chunk | schemas.Finished):
                self.after_end += 1  # a generation that went on (or a second one) after the stream's end
            return
        match e:
            case schemas.Accepted():
                self.accepted = True
            case schemas.Chunk():
                if e.seq in self.seen:
                    self.dup += 1
                    return
                if e.seq != len(self.seqs):
                    self.reordered = True
                self.seen.add(e.seq)
                self.seqs.append(e.seq)
                self.tokens += len(e.token_ids)
                self.first_chunk.set()
            case schemas.Finished():
                self.end("finished", 200)
                self.finished_seq, self.worker_id = e.seq, e.worker_id
            case schemas.Error():
                self.end("error", e.status)
                self.message = e.message
            case schemas.Rejected():
                self.end("rejected", e.status)
                self.message = e.message

    def end(self, kind: str, status: int) -> None:
        """The stream's end, as its reader saw it (an event, or an HTTP answer)."""
        self.terminal, self.status, self.end_s = kind, status, time.monotonic()
        self.done.set()

    @property
    def hole(self) -> bool:
        """Seqs missing for good (as of the stream's end, or now)."""
        return len(self.seen) != (max(self.seen) + 1 if self.seen else 0)

    @property
    def outcome(self) -> str:
        if not self.terminal:
            return "hung"
        if self.terminal != "finished":
            return "failed_clean"
        if self.hole or self.tokens < self.max_tokens or self.finished_seq != len(self.seqs):
            return "silent_short"
        return "completed"


@dataclass
class HttpStream(Stream):
    """One SSE stream through the edge: tokens counted from the text (one byte a token)."""

    usage_tokens: int | None = None
    local_port: int | None = None
    """The client's end of its connection (which front holds the other: fleet.http_peers)."""

    def on_payload(self, payload: str) -> None:
        if self.terminal:
            return
        if payload.strip() == "[DONE]":
            self.end("finished", 200)
            return
        obj = json.loads(payload)
        if err := obj.get("error"):  # an SSE error frame names a code, not a status
            self.end("error", 0)
            self.message = f"{err.get('code') or err.get('type')}: {err.get('message', '')}"
            return
        for choice in obj.get("choices") or ():
            if text := choice.get("text"):
                self.tokens += len(text.encode())
                self.first_chunk.set()
        if usage := obj.get("usage"):
            self.usage_tokens = usage.get("completion_tokens")

    @property
    def hole(self) -> bool:
        return self.terminal == "finished" and self.tokens < self.max_tokens

    @property
    def extra(self) -> int:
        return max(0, self.tokens - self.max_tokens)

    @property
    def outcome(self) -> str:
        if self.terminal == "finished":
            return "completed" if self.tokens == self.max_tokens else "silent_short"
        return super().outcome


async def submit(nc: Client, max_tokens: int, prompt: str, headers: dict | None = None) -> Stream:
    s = Stream(uuid.uuid4().hex, max_tokens)
    inbox = nc.new_inbox()

    async def cb(msg) -> None:
        if not msg.data:
            if msg.headers and msg.headers.get("Status") == "503":
                s.end("rejected", 503)
            return
        with contextlib.suppress(codec.DecodeError):
            s.on_event(codec.decode_event(msg.data, msg.headers))

    s.sub = await nc.subscribe(inbox, cb=cb)  # the subscription lives as long as the stream
    req = schemas.GenerateRequest(prompt=prompt, max_tokens=max_tokens, request_id=s.request_id, ignore_eos=True)
    await nc.publish(subjects.SUBMIT, codec.encode(req), reply=inbox, headers=headers)
    return s


async def submit_via_client(client: TokenyardClient, max_tokens: int, prompt: str) -> Stream:
    """The same stream as a user of TokenyardClient sees it: repeats already dropped, gaps
    and lost ends already turned into errors by the client."""
    s = Stream(uuid.uuid4().hex, max_tokens)
    req = schemas.GenerateRequest(prompt=prompt, max_tokens=max_tokens, request_id=s.request_id, ignore_eos=True)

    async def read() -> None:
        async for e in client.stream(req):
            s.on_event(e)

    s.task = asyncio.create_task(read())
    return s


async def submit_via_http(http: aiohttp.ClientSession, base_url: str, max_tokens: int, prompt: str) -> HttpStream:
    """An OpenAI streaming completion through the edge, read as SSE."""
    s = HttpStream(uuid.uuid4().hex, max_tokens)
    body = {"model": "tokenyard-sim", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}

    async def read() -> None:
        try:
            async with http.post(f"{base_url}/v1/completions", json=body, headers={"x-request-id": s.request_id}) as r:
                if r.connection is not None and r.connection.transport is not None:
                    s.local_port = r.connection.transport.get_extra_info("sockname")[1]
                if r.status != 200:
                    s.end("error", r.status)
                    s.message = (await r.text())[:120]
                    return
                reader = SSEReader()
                async for raw in r.content.iter_any():
                    for payload in reader.feed(raw):
                        s.on_payload(payload)
                for payload in reader.close():
                    s.on_payload(payload)
        except (aiohttp.ClientError, json.JSONDecodeError) as e:
            if not s.terminal:
                s.end("error", 0)
                s.message = f"client: {e!r}"

    s.task = asyncio.create_task(read())
    return s


def note(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def tally(name: str, streams: list[Stream], **extra) -> dict:
    c = Counter(s.outcome for s in streams)
    row = {
        "probe": name,
        "sent": len(streams),
        "completed": c["completed"],
        "failed_clean": c["failed_clean"],
        "hung": c["hung"],
        "duplicated": sum(s.extra if isinstance(s, HttpStream) else s.dup for s in streams),
        "gaps": sum(1 for s in streams if s.hole),
        "reordered": sum(1 for s in streams if s.reordered),
        "silent_short": c["silent_short"],
    }
    errors = Counter(f"{s.status} {s.message[:60]}" for s in streams if s.terminal in ("error", "rejected"))
    if errors:
        row["errors"] = dict(errors.most_common(4))
    row.update(extra)
    return row


async def wait_all(streams: list[Stream], deadline_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline_s):
            await asyncio.gather(*(s.done.wait() for s in streams))
