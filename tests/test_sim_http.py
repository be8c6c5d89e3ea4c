"""The worker's own OpenAI front (services/worker/http.py) over a simulated engine, on a real
HTTP port: completions and chat, streaming and not, prefix hits in usage, vLLM's metric names,
errors, and a client that goes away aborting its request. The official `openai` client reads
it as it reads `vllm serve`."""

from __future__ import annotations

import dataclasses
import json

import aiohttp
import pytest
from tokenyard.services.worker.http import HttpFrontConfig, serve_engine
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import until

MODEL = "sim-model"


@pytest.fixture
async def front():
    prof = dataclasses.replace(profile("a100-llama3-8b"), max_num_seqs=8)
    engine = SimEngine(SimEngineCore(prof, 16, 4096), speed=1000.0)
    f = await serve_engine(engine, ByteTokenizer(), HttpFrontConfig(port=0, model=MODEL))
    yield f
    await f.stop()
    await engine.stop()


def url(front, path: str) -> str:
    return f"http://127.0.0.1:{front.port}{path}"


async def post(front, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url(front, path), json=body) as r:
        return r.status, await r.json()


async def test_a_completion_reports_its_prefix_hit_on_the_second_call(front):
    prompt = "tokenyard " * 10  # 100 bytes: 6 full blocks of 16
    status, first = await post(front, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 5})
    assert status == 200
    assert first["object"] == "text_completion" and first["model"] == MODEL
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                              "prompt_tokens_details": {"cached_tokens": 0}}
    assert first["choices"][0]["text"] == "zy do"  # the filler from offset len("http-" + 32 hex) = 37
    _, second = await post(front, "/v1/completions", {"prompt": prompt, "max_tokens": 5})
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}


async def test_chat_streams_sse_chunks_with_usage(front):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s, s.post(url(front, "/v1/chat/completions"), json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    objs = [json.loads(f) for f in frames[:-1]]
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(o["choices"][0]["delta"].get("content", "") for o in objs if o["choices"])
    assert len(content) == 4
    assert [o["choices"][0]["finish_reason"] for o in objs if o["choices"]][-1] == "length"
    # "<|user|>\nhi\n<|assistant|>\n" = 26 bytes
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["prompt_tokens"] == 26
    assert objs[-1]["usage"]["completion_tokens"] == 4


async def test_models_health_and_vllm_metrics(front):
    async with aiohttp.ClientSession() as s:
        async with s.get(url(front, "/v1/models")) as r:
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL]
        async with s.get(url(front, "/v1/models/other")) as r:
            assert r.status == 404
        async with s.get(url(front, "/health")) as r:
            assert r.status == 200
    await post(front, "/v1/completions", {"prompt": "x" * 40, "max_tokens": 3})
    async with aiohttp.ClientSession() as s, s.get(url(front, "/metrics")) as r:
        text = await r.text()
    label = f'{{model_name="{MODEL}"}}'
    for line in (f"vllm:num_requests_running{label} 0", f"vllm:num_requests_waiting{label} 0",
                 f"vllm:prefix_cache_queries_total{label} 40", f"vllm:generation_tokens_total{label} 3",
                 f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}} 1',
                 "# TYPE vllm:kv_cache_usage_perc gauge"):
        assert line in text.splitlines(), line


async def test_bad_requests_get_openai_errors(front):
    status, body = await post(front, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert (status, body["error"]["code"]) == (404, "model_not_found")
    status, body = await post(front, "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert (status, body["error"]["param"]) == (400, "max_tokens")
    status, body = await post(front, "/v1/chat/completions", {"prompt": "x"})
    assert status == 400
    status, body = await post(front, "/v1/completions", {"prompt": "x", "max_tokens": 4096 * 16})
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    tools = [{"type": "function", "function": {"name": "f"}}]  # a field the engine does not honour (validation.UNSUPPORTED)
    status, body = await post(front, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": tools})
    assert (status, body["error"]["param"], body["error"]["code"]) == (400, "tools", "unsupported_parameter")


async def test_a_client_that_goes_away_aborts_its_request(front):
    body = {"prompt": "abc" * 10, "max_tokens": 30000, "stream": True}
    async with aiohttp.ClientSession() as s:
        r = await s.post(url(front, "/v1/completions"), json=body)
        await r.content.readuntil(b"\n\n")  # the first token arrived
        assert front.engine.stats().running == 1
        r.close()
    await until(lambda: not front.engine.stats().running)  # the handler's cancellation reaches the engine
    assert front.engine.stats().waiting == 0


async def test_the_openai_client_reads_it(front):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=url(front, "/v1"), api_key="none")
    try:
        done = await client.completions.create(model=MODEL, prompt="hello", max_tokens=3)
        assert done.usage.completion_tokens == 3
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=3, stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert len("".join(parts)) == 3
    finally:
        await client.close()
