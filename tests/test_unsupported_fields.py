"""OpenAI's request fields no engine here honours (shared.validation.UNSUPPORTED): a value that
asks for something is a 400 `unsupported_parameter` naming the field, from the one check the
edge, a worker's own HTTP front and admission share; the values that ask for nothing pass, as
clients such as the openai SDK send some of them always. Before, msgspec dropped each of these
fields at decode, and the client got an answer made without it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared import config, schemas, validation
from tokenyard.shared.openai_api import ApiError, Endpoint, parse_request
from tokenyard.shared.tokenizer import ByteTokenizer

MODELS = [config.DEFAULT_MODEL]
ASKING = {  # field → values that ask for something the engines do not do
    "logprobs": [True, 1, 0, 5],
    "top_logprobs": [2, 20],
    "echo": [True],
    "best_of": [2],
    "suffix": ["}\n"],
    "logit_bias": [{"50256": -100.0}],
    "response_format": [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}}],
    "tools": [[{"type": "function", "function": {"name": "f"}}]],
    "tool_choice": ["auto", "required", {"type": "function", "function": {"name": "f"}}],
    "functions": [[{"name": "f"}]],
    "function_call": ["auto", {"name": "f"}],
    "modalities": [["text", "audio"]],
    "audio": [{"voice": "alloy", "format": "wav"}],
    "reasoning_effort": ["low"],
    "web_search_options": [{}],
}
ENDPOINTS = {Endpoint.COMPLETIONS: {"prompt": "Hello"},
             Endpoint.CHAT: {"messages": [{"role": "user", "content": "Hello"}]}}


def parse(endpoint: Endpoint, **fields) -> schemas.GenerateRequest:
    body = json.dumps({"model": MODELS[0], **ENDPOINTS[endpoint], **fields}).encode()
    return parse_request(body, endpoint, MODELS, "r1")


def test_every_unsupported_field_has_asking_values_here():
    assert set(ASKING) == set(validation.UNSUPPORTED)


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in ASKING.items() for v in vs])
def test_a_value_that_asks_for_something_is_a_400_naming_the_field(endpoint, name, value):
    with pytest.raises(ApiError) as e:
        parse(endpoint, **{name: value})
    assert (e.value.status, e.value.param, e.value.code) == (400, name, "unsupported_parameter")
    assert e.value.message.startswith(f"`{name}` is not supported")
    assert e.value.error_dict()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in validation.UNSUPPORTED.items() for v in vs])
def test_a_value_that_asks_for_nothing_passes(endpoint, name, value):
    assert getattr(parse(endpoint, **{name: value}), name) == value


def test_what_the_openai_sdk_and_langchain_send_by_default_passes():
    req = parse(Endpoint.CHAT, n=1, logprobs=False, stream=False, temperature=0.7, presence_penalty=0,
                frequency_penalty=0, tool_choice="none", tools=[], response_format={"type": "text"}, echo=None)
    assert (req.n, req.logprobs, req.presence_penalty) == (1, False, 0.0)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(validation.UNSUPPORTED)), value=JSON, endpoint=st.sampled_from(list(Endpoint)))
def test_any_value_of_a_field_passes_only_when_it_asks_for_nothing_else_a_400_naming_it(name, value, endpoint):
    try:
        req = parse(endpoint, **{name: value})
    except ApiError as e:
        assert e.status == 400 and e.param is not None
        assert e.param == name or e.param.startswith((f"{name}[", f"{name}.")), e.param  # a wrong type inside
        return
    # decoded (0 → 0.0 in a float field) and passed: the value asks for nothing
    assert validation.asks_nothing(getattr(req, name), validation.UNSUPPORTED[name]) or getattr(req, name) is None


def test_admission_refuses_them_too_on_the_bus_changing_nothing():
    """A raw NATS client's request never went through an HTTP front: admission's own check says
    the same, before any state (a tenant's bucket, the fleet's admitted work) is touched."""
    core = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    before = (dict(core.buckets), core.fleet.admitted_depth)
    req = schemas.GenerateRequest(model=config.DEFAULT_MODEL, prompt="Hello", request_id="r1",
                                  tools=[{"type": "function", "function": {"name": "f"}}])
    out = core.admit(req, reply_to="_INBOX.x", json=True, headers={}, now=1.0, new_id="n")
    assert isinstance(out, schemas.Rejected)
    assert (out.status, out.code, out.param) == (400, "unsupported_parameter", "tools")
    assert (dict(core.buckets), core.fleet.admitted_depth) == before
    ok = core.admit(schemas.GenerateRequest(model=config.DEFAULT_MODEL, prompt="Hello", tools=[], logprobs=False),
                    reply_to="_INBOX.x", json=True, headers={}, now=1.0, new_id="n")
    assert isinstance(ok, schemas.AdmittedRequest)


CARRIED = {"presence_penalty": 0.5, "frequency_penalty": -1.5, "repetition_penalty": 1.2, "top_k": 40, "min_p": 0.05,
           "min_tokens": 4}


def test_the_sampling_vllm_applies_reaches_the_engine_as_given():
    """Penalties, top_k, min_p and min_tokens are vLLM's to apply: admission carries them to the
    worker (schemas.Sampling), whose vLLM engine hands them to SamplingParams; none given, none
    set (vLLM's defaults)."""
    core = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    body = parse(Endpoint.CHAT, max_tokens=8, **CARRIED)
    out = core.admit(body, reply_to="_INBOX.x", json=True, headers={}, now=1.0, new_id="n")
    assert isinstance(out, schemas.AdmittedRequest)
    assert {name: getattr(out.sampling, name) for name in CARRIED} == CARRIED
    plain = core.admit(parse(Endpoint.CHAT), reply_to="_INBOX.x", json=True, headers={}, now=1.0, new_id="m")
    assert all(getattr(plain.sampling, name) is None for name in CARRIED)
    assert set(CARRIED) == set(schemas.VllmSampling.__struct_fields__)


@pytest.mark.parametrize(("name", "value"), [
    ("presence_penalty", 2.5), ("frequency_penalty", -2.01), ("repetition_penalty", 0.0), ("repetition_penalty", 2.5),
    ("top_k", -2), ("min_p", 1.5), ("min_tokens", -1), ("min_tokens", 9),
])
def test_sampling_outside_vllms_ranges_is_a_400_naming_it(name, value):
    with pytest.raises(ApiError) as e:
        parse(Endpoint.COMPLETIONS, max_tokens=8, **{name: value})
    assert (e.value.status, e.value.param) == (400, name)


def test_min_tokens_beyond_the_default_max_tokens_is_refused_once_it_is_known():
    core = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    out = core.admit(parse(Endpoint.COMPLETIONS, min_tokens=config.MAX_MODEL_LEN - 1), reply_to="_INBOX.x", json=True,
                     headers={}, now=1.0, new_id="n")
    assert isinstance(out, schemas.Rejected) and (out.status, out.param) == (400, "min_tokens"), out
