"""One validate-and-tokenize (shared/validation.py) behind every door: admission (every NATS
and HTTP request), a worker's own HTTP front, and the edge. Held by a property: for any
request, admission and the worker's front refuse it with the same status and code, or take it
with the same tokens, hashes and max_tokens; whatever the edge forwards is never refused by
admission for its shape."""

from __future__ import annotations

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.worker.http import HttpFrontConfig, WorkerHttp
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import config, openai_api, schemas, validation
from tokenyard.shared.openai_api import ApiError, Endpoint
from tokenyard.shared.schemas import ChatMessage, GenerateRequest
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.test_security_bus_fuzz import builtins_for

MODEL = config.DEFAULT_MODEL
TOK = ByteTokenizer()
ADMISSION = AdmissionCore(AdmissionConfig(slo_check=False), TOK)
# KV for any request within the context length, so only validation can refuse
FRONT = WorkerHttp(SimEngine(SimEngineCore(profile("zero"), 16, 4096)), TOK, HttpFrontConfig(port=0, model=MODEL))

common = {
    "model": st.sampled_from([MODEL, MODEL, "", "other"]),
    "max_tokens": st.integers(-1, 40000),
    "max_completion_tokens": st.integers(-1, 40000),
    "temperature": st.floats(0, 2.2),
    "top_p": st.floats(0.0, 1.1),
    "n": st.sampled_from([1, 1, 1, 2]),
    "request_id": st.sampled_from(["ok-1", "ok-2", "ok-3", "bad id"]),
    "ttft_slo_ms": st.floats(-1, 1e3),
}
one_prompt = st.one_of(
    st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-1, 300), max_size=40))}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "system", "assistant", "wizard"]), "content": st.text(max_size=20)}),
        max_size=3)}),
    st.fixed_dictionaries({"block_hashes": st.lists(st.integers(-5, 5), max_size=4), "prompt_len": st.integers(-1, 80)}),
)
plausible = st.tuples(one_prompt, st.fixed_dictionaries({}, optional=common),
                      st.fixed_dictionaries({}, optional={"prompt": st.just("both")})).map(
    lambda parts: {**parts[0], **parts[1], **parts[2]})


def admission(req: GenerateRequest):
    return ADMISSION.admit(req, reply_to="_INBOX.t", json=True, headers={}, now=1.0, new_id="n")


def worker_front(req: GenerateRequest):
    endpoint = Endpoint.CHAT if req.messages is not None else Endpoint.COMPLETIONS
    try:
        return FRONT.admit(req, endpoint)
    except ApiError as e:
        return e


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(plausible, builtins_for(mi.type_info(GenerateRequest))))
def test_admission_and_the_worker_front_agree_on_every_request(value):
    req = msgspec.convert(value, GenerateRequest)
    verdict, front = admission(req), worker_front(req)
    if isinstance(verdict, schemas.Rejected):
        assert isinstance(front, ApiError), (verdict, front)
        assert (front.status, front.code, front.param) == (verdict.status, verdict.code, verdict.param)
        assert front.message == verdict.message
    else:
        assert isinstance(front, schemas.AdmittedRequest), (verdict, front)
        assert (front.prompt_token_ids, front.prompt_len, front.block_hashes, front.max_tokens) == (
            verdict.prompt_token_ids, verdict.prompt_len, verdict.block_hashes, verdict.max_tokens)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=plausible, chat=st.booleans())
def test_what_the_edge_forwards_admission_never_refuses_for_its_shape(value, chat):
    try:
        req = openai_api.parse_request(msgspec.json.encode(value), Endpoint.CHAT if chat else Endpoint.COMPLETIONS,
                                       [MODEL], "edge-1", max_payload=1 << 20)
    except ApiError as e:
        assert 400 <= e.status < 500
        return
    verdict = admission(req)
    if isinstance(verdict, schemas.Rejected):  # only what needs the tokenizer is left to admission
        assert verdict.param in ("prompt", "messages"), verdict
        assert verdict.code in ("invalid_value", "context_length_exceeded")


@pytest.mark.parametrize("req,status,code", [
    (GenerateRequest(messages=[]), 400, "invalid_value"),  # only admission refused this before
    (GenerateRequest(block_hashes=[1, 2], prompt_len=3), 400, "invalid_value"),  # ... and this
    (GenerateRequest(prompt="a", temperature=5.0), 400, "invalid_value"),  # the worker front took it
    (GenerateRequest(prompt="a", max_tokens=2**40), 400, "context_length_exceeded"),
])
def test_the_drifted_cases_of_issue_16_are_refused_alike(req, status, code):
    verdict, front = admission(req), worker_front(req)
    assert (verdict.status, verdict.code) == (status, code)
    assert (front.status, front.code) == (status, code)


@pytest.mark.parametrize("req,max_tokens", [
    (GenerateRequest(prompt="hello"), config.DEFAULT_MAX_TOKENS),
    (GenerateRequest(messages=[ChatMessage("user", "hello")]), config.DEFAULT_CHAT_MAX_TOKENS),
    (GenerateRequest(prompt="x" * (config.MAX_MODEL_LEN - 5)), 5),  # the default never overflows the context
])
def test_one_default_max_tokens_everywhere(req, max_tokens):
    assert admission(req).max_tokens == max_tokens
    assert worker_front(req).max_tokens == max_tokens


def test_the_openapi_document_states_the_rules_check_enforces():
    from tokenyard.shared.http_front import openapi_document

    doc = openapi_document("t", 1000, validation.Limits(models=(MODEL,)))
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["model"]["enum"] == [MODEL]
    assert props["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": config.MAX_MODEL_LEN}
    assert props["temperature"]["anyOf"][0]["maximum"] == 2.0
    assert "messages" not in props and "block_hashes" not in props
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["messages"] and "prompt" not in chat["properties"]


async def test_the_worker_front_is_the_same_app_with_the_same_refusals():
    """One app factory: the worker's HTTP front serves its OpenAPI document and answers the
    inputs that once crashed the edge with the same 4xx."""
    import aiohttp
    from tokenyard.services.worker.http import serve_engine

    front = await serve_engine(SimEngine(SimEngineCore(profile("zero"), 16, 4096), speed=1000.0), TOK,
                               HttpFrontConfig(port=0, model=MODEL))
    url = f"http://127.0.0.1:{front.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/openapi.json") as resp:
                doc = await resp.json()
            assert doc["info"]["title"] == "tokenyard worker"
            assert doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]["enum"] == [MODEL]
            bodies = {
                b'{"prompt": "a", "max_tokens": ' + str(2**70).encode() + b"}": (400, "invalid_value"),
                b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}": (400, "invalid_json"),
                b'{"prompt": "' + b"x" * (2 * 1024 * 1024) + b'"}': (413, "request_too_large"),
                b'{"messages": []}': (400, "missing_required_parameter"),  # the chat endpoint's own rule
            }
            for body, expected in bodies.items():
                path = "/v1/chat/completions" if body.startswith(b'{"messages"') else "/v1/completions"
                async with http.post(url + path, data=body) as resp:
                    assert (resp.status, (await resp.json())["error"]["code"]) == expected, body[:60]
            async with http.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 2}) as resp:
                assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 2
    finally:
        await front.stop()
        await front.engine.stop()
