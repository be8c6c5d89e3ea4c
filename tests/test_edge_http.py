"""The edge over real HTTP and a real nats-server, against a hand-written fake admission that
answers `llm.v1.submit` from a script chosen by the prompt; clients are the official `openai`
client and raw aiohttp. One e2e test runs through the real pipeline (`fleet` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import aiohttp
import msgspec
import nats.errors
import openai
import pytest
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell, health_subject
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

MODEL = "m1"
USAGE = schemas.Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7, cached_tokens=3)


class FakeAdmission:
    """Admission + worker in one: answers each submit per the prompt (or last message):
    `reject429` → Rejected 429 · `fail` → Accepted, Chunk, Error 500 · `hang` → Accepted, Chunk,
    then nothing · `silent` → nothing · anything else → Accepted, "He", "y", Finished."""

    def __init__(self, nc, workers_up: int = 1):
        self.nc = nc
        self.seen: dict[str, tuple[schemas.GenerateRequest, dict[str, str]]] = {}
        self.fleet = schemas.FleetHealth(workers_up=workers_up, workers_known=max(1, workers_up))
        """What it answers on llm.v1.admission.health (the edge's readiness)."""

    async def start(self) -> FakeAdmission:
        await self.nc.subscribe(subjects.SUBMIT, cb=self._on_submit)
        await self.nc.subscribe(subjects.ADMISSION_HEALTH, cb=self._on_health)
        await self.nc.flush()
        return self

    async def _on_health(self, msg) -> None:
        await msg.respond(codec.encode(self.fleet))

    async def _on_submit(self, msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest, json=codec.is_json(msg.headers))
        rid = req.request_id
        self.seen[rid] = (req, dict(msg.headers or {}))
        script = req.prompt if isinstance(req.prompt, str) else (req.messages or [None])[-1].content
        accepted = schemas.Accepted(rid, priority=1, prompt_tokens=5)
        chunk0 = schemas.Chunk(rid, 0, "He", [72, 101])
        match script:
            case "reject429":
                events = [
                    schemas.Rejected(
                        rid, 429, "rate_limit_exceeded", "tenant over its rate", retry_after_s=1.5
                    )
                ]
            case "fail":
                events = [accepted, chunk0, schemas.Error(rid, 500, "worker lost")]
            case "hang":
                events = [accepted, chunk0]
            case "silent":
                events = []
            case _:
                events = [
                    accepted,
                    chunk0,
                    schemas.Chunk(rid, 1, "y", [121]),
                    schemas.Finished(rid, 2, "length", USAGE),
                ]
        for event in events:
            await self.nc.publish(msg.reply, codec.encode(event))


@dataclass
class Edge:
    nc: object
    fake: FakeAdmission
    shell: EdgeShell
    url: str

    def openai(self, **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="sk-test", max_retries=0, **kwargs)


@pytest.fixture(scope="module")
async def edge_nats(plain_nats):
    return plain_nats


async def start_edge(url: str, **cfg) -> ServiceHost:
    cfg.setdefault("models", [MODEL])
    return await ServiceHost(EdgeShell(EdgeConfig(http_port=0, **cfg)), url).start()


@pytest.fixture(scope="module")
async def edge(edge_nats):
    nc = await natsutil.connect(edge_nats.url, "fake-admission")
    fake = await FakeAdmission(nc).start()
    host = await start_edge(edge_nats.url)
    yield Edge(nc, fake, host.shell, f"http://127.0.0.1:{host.shell.port}")
    await host.stop()
    await nc.drain()


async def next_abort(sub, request_id: str) -> schemas.Abort:
    """The next Abort for `request_id` (others' aborts are skipped)."""
    while True:
        msg = await sub.next_msg(timeout=5)
        abort = codec.decode(msg.data, schemas.Abort)
        if abort.request_id == request_id:
            return abort


# ───────────────────────────── openai client ─────────────────────────────


async def test_completion_non_streaming(edge):
    client = edge.openai()
    out = await client.completions.create(
        model=MODEL, prompt="hi", max_tokens=2, extra_headers={"x-request-id": "c1"}
    )
    assert (out.id, out.object, out.model) == ("cmpl-c1", "text_completion", MODEL)
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [(0, "Hey", "length")]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (5, 2, 7)
    req, _ = edge.fake.seen["c1"]
    assert (req.prompt, req.max_tokens, req.model, req.stream) == ("hi", 2, MODEL, False)


async def test_completion_streaming(edge):
    client = edge.openai()
    stream = await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True)
    chunks = [c async for c in stream]
    assert [c.choices[0].text for c in chunks] == ["He", "y", ""]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "length"]
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-")


async def test_chat_streaming_with_usage(edge):
    client = edge.openai()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": "chat1"},
    )
    chunks = [c async for c in stream]
    assert all(c.id == "chatcmpl-chat1" and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hey"
    assert chunks[-2].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (5, 2, 7)
    assert last.usage.prompt_tokens_details.cached_tokens == 3
    req, _ = edge.fake.seen["chat1"]
    assert req.messages == [schemas.ChatMessage(role="user", content="hi")]
    assert req.stream_options == schemas.StreamOptions(include_usage=True)


async def test_chat_non_streaming(edge):
    out = await edge.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert out.object == "chat.completion"
    assert (out.choices[0].message.role, out.choices[0].message.content) == ("assistant", "Hey")
    assert out.usage.total_tokens == 7


async def test_unknown_model_is_not_found(edge):
    with pytest.raises(openai.NotFoundError) as info:
        await edge.openai().completions.create(model="gpt-nope", prompt="hi")
    assert info.value.code == "model_not_found"
    assert info.value.body["param"] == "model"


async def test_bad_input_is_bad_request(edge):
    with pytest.raises(openai.BadRequestError) as info:
        await edge.openai().completions.create(model=MODEL, prompt="hi", n=2)
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        await edge.openai().completions.create(model=MODEL, prompt="hi", extra_body={"max_tokens": "ten"})


async def test_rejection_maps_to_status_and_retry_after(edge):
    with pytest.raises(openai.RateLimitError) as info:
        await edge.openai().completions.create(model=MODEL, prompt="reject429", stream=True)
    assert info.value.response.headers["retry-after"] == "2"
    assert info.value.body == {
        "message": "tenant over its rate",
        "type": "rate_limit_exceeded",
        "param": None,
        "code": "rate_limit_exceeded",
    }


async def test_error_mid_stream_raises_in_client(edge):
    stream = await edge.openai().completions.create(model=MODEL, prompt="fail", stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="worker lost"):
        async for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["He"]


async def test_error_non_streaming_keeps_status(edge):
    with pytest.raises(openai.InternalServerError):
        await edge.openai().completions.create(model=MODEL, prompt="fail")


# ───────────────────────────── raw HTTP ─────────────────────────────


async def test_streaming_rejection_is_json_not_sse(edge):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{edge.url}/v1/completions", json={"prompt": "reject429", "stream": True}) as r:
            assert r.status == 429
            assert r.content_type == "application/json"
            assert r.headers["Retry-After"] == "2"
            assert (await r.json())["error"]["code"] == "rate_limit_exceeded"


async def test_sse_wire_format(edge):
    async with aiohttp.ClientSession() as s:
        body = {"prompt": "hi", "stream": True}
        async with s.post(f"{edge.url}/v1/completions", json=body, headers={"x-request-id": "sse1"}) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert r.headers["x-request-id"] == "sse1"
            raw = await r.read()
    frames = raw.split(b"\n\n")
    assert frames[-2:] == [b"data: [DONE]", b""]
    assert [json.loads(f[6:])["choices"][0]["text"] for f in frames[:-2]] == ["He", "y", ""]


async def test_headers_are_forwarded_to_nats(edge):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {
        "x-request-id": "h1",
        "x-request-tier": "P2",
        "x-tenant": "acme",
        "Authorization": "Bearer sk-acme",
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{edge.url}/v1/completions", json={"prompt": "hi"}, headers=headers) as r:
            assert r.status == 200
            assert r.headers["x-request-id"] == "h1"
    _, nats_headers = edge.fake.seen["h1"]
    assert (nats_headers["x-request-tier"], nats_headers["x-tenant"], nats_headers["x-api-key"]) == (
        "P2",
        "acme",
        "sk-acme",
    )
    _, got_trace, got_span, _ = nats_headers["traceparent"].split("-")
    assert got_trace == trace_id  # the edge's span is a child of the caller's
    assert got_span != "00f067aa0ba902b7"


async def test_fresh_request_id_when_none_given(edge):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{edge.url}/v1/completions", json={"prompt": "hi"}) as r:
            rid = r.headers["x-request-id"]
            assert (await r.json())["id"] == f"cmpl-{rid}"
    assert len(rid) == 32 and rid in edge.fake.seen


@pytest.mark.parametrize(
    ("method", "path", "data", "status", "code"),
    [
        ("GET", "/v1/nothing", None, 404, "not_found"),
        ("GET", "/v1/completions", None, 405, "method_not_allowed"),
        ("POST", "/v1/completions", b"{oops", 400, "invalid_json"),
        ("POST", "/v1/chat/completions", b'{"prompt": "x"}', 400, None),
    ],
)
async def test_http_errors_are_openai_bodies(edge, method, path, data, status, code):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"{edge.url}{path}", data=data) as r:
            assert r.status == status
            body = await r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", code)


async def test_body_too_large_is_413(edge_nats):
    host = await start_edge(edge_nats.url, max_body_bytes=1024)
    try:
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{host.shell.port}/v1/completions"
            async with s.post(url, data=json.dumps({"prompt": "x" * 4096})) as r:
                assert r.status == 413
                assert (await r.json())["error"]["code"] == "request_too_large"
    finally:
        await host.stop()


async def test_models_health_and_metrics(edge):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{edge.url}/v1/completions", json={"prompt": "hi"}) as r:
            assert r.status == 200
        async with s.get(f"{edge.url}/health") as r:
            assert (r.status, await r.json()) == (200, {"status": "ok", "workers_up": 1, "workers_known": 1})
        async with s.get(f"{edge.url}/metrics") as r:
            metrics = await r.text()
        async with s.get(f"{edge.url}/v1/models/{MODEL}") as r:
            assert (await r.json())["id"] == MODEL
        async with s.get(f"{edge.url}/v1/models/other") as r:
            assert r.status == 404
    models = await edge.openai().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert 'tokenyard:edge_requests_total{endpoint="completions",outcome="finished"}' in metrics
    assert 'tokenyard:edge_ttft_seconds_count{endpoint="completions"}' in metrics
    assert "tokenyard:edge_in_flight_requests 0.0" in metrics


async def test_a_field_no_engine_honours_is_refused_by_name_before_admission_hears_of_it(edge):
    client = edge.openai()
    with pytest.raises(openai.BadRequestError) as e:
        await client.completions.create(model=MODEL, prompt="hi", logprobs=2, extra_headers={"x-request-id": "unsup1"})
    assert (e.value.param, e.value.code) == ("logprobs", "unsupported_parameter")
    assert "unsup1" not in edge.fake.seen
    out = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=1,
                                               logprobs=False, extra_headers={"x-request-id": "unsup2"})
    assert out.choices[0].message.content == "Hey"
    assert edge.fake.seen["unsup2"][0].logprobs is False


async def test_micro_health_endpoint(edge):
    reply = await edge.nc.request(health_subject(edge.shell.instance_id), b"", timeout=5)
    status = msgspec.json.decode(reply.data)
    assert (status["status"], status["instance"], status["models"]) == ("ok", edge.shell.instance_id, [MODEL])


async def health(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as r:
        return r.status, await r.json()


# ───────────────────────────── aborts ─────────────────────────────


async def test_client_disconnect_aborts_the_request(edge):
    sub = await edge.nc.subscribe(subjects.ABORT)
    await edge.nc.flush()
    try:
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "hang", "stream": True}
            r = await s.post(f"{edge.url}/v1/completions", json=body, headers={"x-request-id": "gone1"})
            assert r.status == 200
            assert (await r.content.readline()).startswith(b"data: ")  # the first chunk arrived
            r.close()  # drop the connection mid-stream
        abort = await next_abort(sub, "gone1")
        assert abort.reason == "client_cancelled"
    finally:
        await sub.unsubscribe()


async def test_a_write_that_fails_mid_stream_aborts_the_request_once(edge, monkeypatch):
    """The client's connection resets under a write (no cancellation reaches the handler): the
    stream, closed unfinished, aborts its generation — once, not also by the edge on its own."""
    from tokenyard.services.edge import shell as edge_shell

    async def reset(self, data):
        raise ConnectionResetError("the client is gone")

    monkeypatch.setattr(edge_shell.SseResponse, "write", reset)
    monkeypatch.setattr(edge_shell, "HEADERS_HOLD_S", 5.0)  # the first write is the frames', not the held status's
    sub = await edge.nc.subscribe(subjects.ABORT)
    await edge.nc.flush()
    try:
        async with aiohttp.ClientSession() as s:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(5):
                    await s.post(f"{edge.url}/v1/completions", json={"prompt": "hang", "stream": True},
                                 headers={"x-request-id": "reset1"})
        abort = await next_abort(sub, "reset1")
        assert (abort.reason, abort.reply_to.startswith("_INBOX.")) == ("client_left", True)  # this generation only
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=1.0)  # no second abort, of this request or any
    finally:
        await sub.unsubscribe()


async def test_silent_admission_gives_503_and_aborts(edge_nats):
    host = await start_edge(edge_nats.url, accept_timeout_s=0.2)
    nc = await natsutil.connect(edge_nats.url, "abort-watch")
    sub = await nc.subscribe(subjects.ABORT)
    await nc.flush()
    try:
        url = f"http://127.0.0.1:{host.shell.port}/v1/completions"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json={"prompt": "silent"}, headers={"x-request-id": "quiet1"}) as r:
                assert r.status == 503
                assert (await r.json())["error"]["code"] == "admission_unavailable"
        await next_abort(sub, "quiet1")
    finally:
        await host.stop()
        await nc.drain()


# ───────────────────────────── e2e ─────────────────────────────


async def test_an_edge_whose_client_is_closed_answers_at_once_and_publishes_nothing(edge_nats):
    """The stream's first yield is then its end, not "published": the edge answers that end
    (499, the client closed) without waiting for admission or sending the request."""
    nc = await natsutil.connect(edge_nats.url, "watch-submit")
    sub = await nc.subscribe(subjects.SUBMIT)
    await nc.flush()
    host = await start_edge(edge_nats.url)
    try:
        await host.shell.client.close()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{host.shell.port}/v1/completions",
                              json={"prompt": "hi", "stream": True}) as r:
                assert r.status == 499
                assert "closed" in (await r.json())["error"]["message"]
        assert sub.pending_msgs == 0
    finally:
        await host.stop()
        await nc.close()


@pytest.fixture
def fleet_or_skip(request):
    try:
        return request.getfixturevalue("fleet")
    except pytest.FixtureLookupError:
        pytest.skip("the `fleet` fixture (tests/conftest.py) is not defined yet")


@pytest.mark.e2e
async def test_openai_client_through_real_pipeline(fleet_or_skip):
    host = await start_edge(fleet_or_skip.nats_url, models=[config.DEFAULT_MODEL])
    try:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{host.shell.port}/v1", api_key="k", max_retries=0, timeout=30
        )
        out = await client.completions.create(model=config.DEFAULT_MODEL, prompt="Hello, fleet", max_tokens=4)
        assert out.choices[0].finish_reason in ("stop", "length")
        assert out.usage.completion_tokens >= 1 and out.usage.prompt_tokens >= 1
        stream = await client.chat.completions.create(
            model=config.DEFAULT_MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
        # readiness from the real admission's answer on llm.v1.admission.health: its two workers up
        assert await health(f"http://127.0.0.1:{host.shell.port}") == \
            (200, {"status": "ok", "workers_up": 2, "workers_known": 2})
    finally:
        await host.stop()
