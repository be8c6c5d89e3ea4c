"""The edge's SSE headers leave with the first token (services/edge/shell.py, SseResponse and
HEADERS_HOLD_S): after `accepted` they wait in the response's buffer, so the status line and
the first frame reach the client in one send; a first token that is not near within the hold
finds them gone alone; a client that leaves during the hold still aborts its request. A raw
TCP client sees exactly when each byte arrives."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tokenyard.services.edge import shell as edge_shell
from tokenyard.shared import codec, natsutil, schemas, subjects

from tests.test_edge_http import MODEL, USAGE, next_abort, start_edge


class SlowFirstToken:
    """Admission + worker in one: `accepted` at once, the first chunk `delay_s` later (the
    prompt says how long, in ms), then `finished`; prompt "never": `accepted` and nothing more."""

    def __init__(self, nc):
        self.nc = nc

    async def start(self) -> SlowFirstToken:
        await self.nc.subscribe(subjects.SUBMIT, cb=self._on_submit)
        await self.nc.flush()
        return self

    async def _on_submit(self, msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest, json=codec.is_json(msg.headers))
        rid = req.request_id
        await self.nc.publish(msg.reply, codec.encode(schemas.Accepted(rid, priority=1, prompt_tokens=5)))
        await self.nc.flush()
        if req.prompt == "never":
            return
        await asyncio.sleep(int(req.prompt) / 1000)
        for event in (schemas.Chunk(rid, 0, "He", [72, 101]), schemas.Finished(rid, 1, "length", USAGE)):
            await self.nc.publish(msg.reply, codec.encode(event))


@pytest.fixture
async def slow_edge(plain_nats):
    nc = await natsutil.connect(plain_nats.url, "slow-first-token")
    await SlowFirstToken(nc).start()
    host = await start_edge(plain_nats.url)
    yield nc, host.shell.port
    await host.stop()
    await nc.drain()


async def arrivals(port: int, prompt: str, request_id: str) -> tuple[list[tuple[float, bytes]], asyncio.StreamWriter]:
    """POST a streaming completion over a raw socket; each piece of the response as it arrived
    (seconds after the request went out), until the body's end or 5 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"x-request-id: " + request_id.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    t0, got = time.monotonic(), []
    async with asyncio.timeout(5):
        while not got or not got[-1][1].endswith(b"0\r\n\r\n"):
            piece = await reader.read(65536)
            if not piece:
                break
            got.append((time.monotonic() - t0, piece))
    return got, writer


async def test_the_status_line_and_the_first_token_arrive_in_one_piece(slow_edge, monkeypatch):
    monkeypatch.setattr(edge_shell, "HEADERS_HOLD_S", 2.0)  # a generous hold: the token comes at 0.2 s
    _, port = slow_edge
    got, writer = await arrivals(port, "200", "one-send")
    writer.close()
    first_at, first = got[0]
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert b"\r\n\r\n" in first and b'data: {"id":"cmpl-one-send"' in first  # headers and the first frame together
    assert first_at >= 0.2  # nothing went out at `accepted` (the old edge sent the headers then)


async def test_headers_leave_alone_when_the_first_token_is_not_near(slow_edge, monkeypatch):
    monkeypatch.setattr(edge_shell, "HEADERS_HOLD_S", 0.1)
    _, port = slow_edge
    got, writer = await arrivals(port, "1500", "slow-token")
    writer.close()
    (headers_at, headers), (token_at, token) = got[0], got[1]
    assert headers.startswith(b"HTTP/1.1 200 OK") and b"data:" not in headers
    assert 0.1 <= headers_at < 1.0  # the hold, not the token
    assert b"data: {" in token and token_at >= 1.5


async def test_a_client_that_leaves_during_the_hold_aborts_its_request(slow_edge, monkeypatch):
    monkeypatch.setattr(edge_shell, "HEADERS_HOLD_S", 5.0)
    nc, port = slow_edge
    sub = await nc.subscribe(subjects.ABORT)
    await nc.flush()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": MODEL, "prompt": "never", "stream": True}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"x-request-id: left-early\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        await asyncio.sleep(0.3)  # `accepted` is in; the headers wait in the edge's buffer
        writer.close()
        abort = await next_abort(sub, "left-early")
        assert abort.reason == "client_cancelled"
    finally:
        await sub.unsubscribe()
