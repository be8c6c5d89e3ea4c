"""Bad input at the edge, through the whole fleet on the secured session server: every one a
4xx with OpenAI's error body (the inputs issue 14 found answered 500 first), the body limit
following NATS's max payload, API keys naming tenants, and the edge still serving after it
all. The OpenAPI-driven fuzzing is in test_edge_fuzz_openapi.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import aiohttp
import pytest
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.tenants import load_tenants
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
from tokenyard.shared import config, openai_api, schemas
from tokenyard.shared.client import TokenyardClient

from tests.conftest import start_inproc_fleet, until

DEEP = 100_000


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


BAD = [
    # name, path, body, headers, status, code
    ("json nested 100k deep, unknown field", "completions", '{"prompt": "a", "x": ' + nested(DEEP) + "}", {}, 400,
     "invalid_json"),
    ("json nested 100k deep as the prompt", "completions", '{"prompt": ' + nested(DEEP) + "}", {}, 400, "invalid_type"),
    ("object nested 100k deep in chat content", "chat",
     '{"messages": [{"role": "user", "content": [{"type": "text", "x": '
     + '{"a": ' * DEEP + "1" + "}" * DEEP + "}]}]}",
     {}, 400, "invalid_json"),
    ("max_tokens 2^70", "completions", json.dumps({"prompt": "a", "max_tokens": 2**70}), {}, 400, "invalid_value"),
    ("max_tokens 2^63-1", "completions", json.dumps({"prompt": "a", "max_tokens": 2**63 - 1}), {}, 400,
     "context_length_exceeded"),
    ("max_tokens 0", "completions", '{"prompt": "a", "max_tokens": 0}', {}, 400, "invalid_value"),
    ("max_completion_tokens -5", "chat", '{"messages": [{"role": "user", "content": "a"}], '
     '"max_completion_tokens": -5}', {}, 400, "invalid_value"),
    ("seed 2^64", "completions", json.dumps({"prompt": "a", "seed": 2**64}), {}, 400, "invalid_value"),
    ("an int MessagePack cannot carry inside chat content", "chat",
     json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "n": 2**70}]}]}), {}, 400,
     "invalid_value"),
    ("temperature 1e999", "completions", '{"prompt": "a", "temperature": 1e999}', {}, 400, "invalid_value"),
    ("ttft_slo_ms 1e999", "completions", '{"prompt": "a", "ttft_slo_ms": 1e999}', {}, 400, "invalid_value"),
    ("top_p 0", "completions", '{"prompt": "a", "top_p": 0}', {}, 400, "invalid_value"),
    ("token id outside the vocabulary", "completions", json.dumps({"prompt": [1, 2, 2**40]}), {}, 400,
     "invalid_value"),
    ("negative token id", "completions", '{"prompt": [-1]}', {}, 400, "invalid_value"),
    ("replay without prompt_len", "completions", '{"block_hashes": [1, 2]}', {}, 400, "invalid_value"),
    ("replay covering more than prompt_len", "completions", '{"block_hashes": [1, 2], "prompt_len": 3}', {}, 400,
     "invalid_value"),
    ("unknown chat role", "chat", '{"messages": [{"role": "wizard", "content": "a"}]}', {}, 400, "invalid_value"),
    ("empty messages", "chat", '{"messages": []}', {}, 400, "missing_required_parameter"),
    ("n = 3", "completions", '{"prompt": "a", "n": 3}', {}, 400, "invalid_value"),
    # admitted before, then a vLLM worker's SamplingParams raised on it: an `error` 500 mid-request
    ("an empty stop string", "completions", '{"prompt": "a", "stop": ""}', {}, 400, "invalid_value"),
    ("an empty string among the stops", "chat", '{"messages": [{"role": "user", "content": "a"}], '
     '"stop": ["done", ""]}', {}, 400, "invalid_value"),
    ("unknown model", "completions", '{"prompt": "a", "model": "gpt-9"}', {}, 404, "model_not_found"),
    ("not JSON", "completions", "{", {}, 400, "invalid_json"),
    ("not UTF-8", "completions", b'{"prompt": "\xff\xfe"}', {}, 400, "invalid_json"),
    ("a JSON array", "completions", "[]", {}, 400, "invalid_type"),
    ("JSON null", "completions", "null", {}, 400, "invalid_type"),
    ("empty body", "completions", "", {}, 400, "invalid_json"),
    ("x-request-id with a slash", "completions", '{"prompt": "a"}', {"x-request-id": "a/b"}, 400, "invalid_value"),
    ("x-request-id of 200 characters", "completions", '{"prompt": "a"}', {"x-request-id": "r" * 200}, 400,
     "invalid_value"),
    ("unknown tier", "completions", '{"prompt": "a"}', {"x-request-tier": "P9"}, 400, "invalid_value"),
    ("a 3.9 MB prompt", "completions", json.dumps({"prompt": "x" * 3_900_000}), {}, 413, "request_too_large"),
    ("a prompt that fits the bus but not the model", "completions", json.dumps({"prompt": "x" * 900_000}), {}, 400,
     "context_length_exceeded"),
]


@pytest.fixture
async def edge(fleet):
    host = await fleet.add(EdgeShell(EdgeConfig(http_port=0)))
    yield host.shell


async def test_every_bad_input_is_a_4xx_with_an_openai_error_body(edge):
    url = f"http://127.0.0.1:{edge.port}"
    got = {}
    async with aiohttp.ClientSession() as http:
        for name, path, body, headers, _status, _code in BAD:
            data = body.encode() if isinstance(body, str) else body
            async with http.post(f"{url}/v1/{path.replace('chat', 'chat/completions')}", data=data,
                                 headers={"content-type": "application/json", **headers}) as resp:
                payload = await resp.json()
                got[name] = (resp.status, payload["error"]["code"])
                assert payload["error"]["type"] == "invalid_request_error", (name, payload)
        # and the edge still serves
        async with http.post(f"{url}/v1/completions", json={"prompt": "still here", "max_tokens": 3}) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["completion_tokens"] == 3
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
    assert got == {name: (status, code) for name, _, _, _, status, code in BAD}
    assert 'outcome="failed"' not in text  # nothing above reached the fleet only to fail there


async def test_wrong_routes_and_methods_are_4xx_too(edge):
    url = f"http://127.0.0.1:{edge.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/completions") as resp:
            assert resp.status == 405 and (await resp.json())["error"]["code"] == "method_not_allowed"
        async with http.post(f"{url}/v2/anything", data=b"{}") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        async with http.post(f"{url}/v1/completions", data=b"{}", headers={"x-request-id": "h" * 10_000}) as resp:
            assert resp.status == 400  # aiohttp's own header limit
        four_keys = {h: "k" * 1500 for h in ("x-tenant", "authorization", "tracestate")}
        four_keys["authorization"] = "Bearer " + four_keys["authorization"]
        async with http.post(f"{url}/v1/completions", json={"prompt": "a"}, headers=four_keys) as resp:
            assert resp.status == 431  # each within HTTP's limits, together beyond a NATS message's header room
            assert (await resp.json())["error"]["code"] == "request_headers_too_large"


async def test_a_body_that_never_arrives_whole_is_a_408_and_frees_its_place(edge, monkeypatch):
    """Content-Length 100 and 5 bytes sent: the request held one of the edge's max_in_flight
    places for as long as the client kept its connection open."""
    from tokenyard.shared import http_front

    monkeypatch.setattr(http_front, "BODY_READ_S", 0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"pro")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408"), head
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        error = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))["error"]
        assert (error["code"], error["type"]) == ("request_timeout", "invalid_request_error"), error
    finally:
        writer.close()
    await until(lambda: edge.in_flight == 0, what="the edge's place given back")
    async with aiohttp.ClientSession() as http:  # and it serves
        async with http.post(f"http://127.0.0.1:{edge.port}/v1/completions", json={"prompt": "a", "max_tokens": 2}) as resp:
            assert resp.status == 200


async def test_the_body_limit_follows_the_nats_max_payload(edge):
    """Whatever the edge takes fits one NATS message: the limit is the server's max payload
    less room for headers, and a body one byte over is refused unread."""
    assert edge.max_payload == 1024 * 1024
    assert edge.max_body_bytes == openai_api.body_limit(edge.max_payload) == 1024 * 1024 - 16 * 1024
    url = f"http://127.0.0.1:{edge.port}/v1/completions"
    prefix = b'{"prompt": "'
    suffix = b'"}'
    async with aiohttp.ClientSession() as http:
        for size, status in ((edge.max_body_bytes, 400), (edge.max_body_bytes + 1, 413)):
            body = prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix
            assert len(body) == size
            async with http.post(url, data=body) as resp:
                assert resp.status == status, (size, await resp.text())
    # the largest body the edge takes, sent on as MessagePack with the longest request id,
    # leaves the header room free
    req = schemas.GenerateRequest(prompt="x" * (edge.max_body_bytes - 14), model=config.DEFAULT_MODEL,
                                  request_id="r" * 128)
    assert len(openai_api.codec.encode(req)) <= edge.max_payload - openai_api.NATS_HEADER_ROOM


TENANTS = {
    "default": {"ceiling": "P1"},
    "tenants": {"vip": {"ceiling": "P0", "api_keys": ["sk-vip"]}, "batch": {"pin": "P2", "api_keys": ["sk-batch"]}},
}


@pytest.fixture
async def keyed_fleet(nats_server):
    f = await start_inproc_fleet(nats_server.url, admission=AdmissionConfig(tenants=load_tenants(TENANTS)))
    yield f
    await f.stop()
    await f.nats.drain()


@pytest.mark.parametrize("headers,body,status,priority", [
    ({"x-tenant": "vip", "x-request-tier": "P0"}, {}, 200, 1),  # a claim without a key: anonymous, P1
    ({"x-request-tier": "P0"}, {"tenant": "vip", "user": "vip"}, 200, 1),
    ({"authorization": "Bearer sk-vip", "x-request-tier": "P0"}, {}, 200, 0),  # the key names vip
    ({"authorization": "Bearer sk-batch", "x-request-tier": "P0", "x-tenant": "vip"}, {}, 200, 2),  # pinned
    ({"authorization": "Bearer sk-forged", "x-tenant": "vip"}, {}, 401, None),
])
async def test_api_keys_name_tenants_and_claims_without_one_are_ignored(keyed_fleet, headers, body, status, priority):
    """Over HTTP (the edge forwards `Authorization: Bearer` as x-api-key) and over NATS (the
    same headers), admission gives the class the key's tenant allows, never the claim's."""
    edge = (await keyed_fleet.add(EdgeShell(EdgeConfig(http_port=0)))).shell
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{edge.port}/v1/completions", headers=headers,
                             json={"prompt": "tenant?", "max_tokens": 2, **body}) as resp:
            assert resp.status == status, await resp.text()
    nats_headers = {k if k != "authorization" else "x-api-key": v.removeprefix("Bearer ") for k, v in headers.items()}
    client = TokenyardClient(keyed_fleet.nats)
    stream = client.stream(schemas.GenerateRequest(prompt="tenant?", max_tokens=2, **body), headers=nats_headers)
    async with contextlib.aclosing(stream):
        first = await anext(stream)
    if priority is None:
        assert isinstance(first, schemas.Rejected) and (first.status, first.code) == (401, "invalid_api_key")
    else:
        assert isinstance(first, schemas.Accepted) and first.priority == priority
