"""The edge's pure core: HTTP body → GenerateRequest, stream events → OpenAI objects, exactly."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.services.edge import core
from tokenyard.services.edge.core import ApiError, Endpoint
from tokenyard.shared import schemas
from tokenyard.shared.schemas import Outcome

MODELS = ["m1", "m2"]


def parse(body, endpoint=Endpoint.COMPLETIONS, models=MODELS, request_id="r1"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return core.parse_request(raw, endpoint, models, request_id)


def parse_error(body, endpoint=Endpoint.COMPLETIONS, models=MODELS) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, endpoint, models)
    return info.value


def frames_json(frames: list[bytes]) -> list:
    """Decode SSE frames; `[DONE]` stays a string."""
    out = []
    for f in frames:
        assert f.startswith(b"data: ") and f.endswith(b"\n\n")
        payload = f[len(b"data: ") : -2]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


# ───────────────────────────── parsing ─────────────────────────────


def test_completion_body_becomes_generate_request():
    req = parse(
        {
            "model": "m2",
            "prompt": "Hello",
            "max_tokens": 7,
            "temperature": 0.5,
            "stop": ["\n"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "priority": 2,
            "logprobs": None,  # fields tokenyard does not use are ignored
        }
    )
    assert req == schemas.GenerateRequest(
        model="m2",
        prompt="Hello",
        max_tokens=7,
        temperature=0.5,
        stop=["\n"],
        stream=True,
        stream_options=schemas.StreamOptions(include_usage=True),
        priority=2,
        request_id="r1",
    )


def test_chat_body_becomes_generate_request():
    req = parse(
        {"model": "m1", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 3},
        Endpoint.CHAT,
    )
    assert req == schemas.GenerateRequest(
        model="m1",
        messages=[schemas.ChatMessage(role="user", content="Hi")],
        max_completion_tokens=3,
        request_id="r1",
    )


def test_token_id_prompt_and_missing_model_defaults_to_first_served():
    req = parse({"prompt": [1, 2, 3]})
    assert (req.model, req.prompt) == ("m1", [1, 2, 3])


def test_empty_model_list_serves_any_name():
    assert parse({"model": "anything", "prompt": "x"}, models=[]).model == "anything"


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (b"{not json", 400, None, "invalid_json"),
        (b"", 400, None, "invalid_json"),
        ([1, 2], 400, None, "invalid_type"),
        ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "invalid_type"),
        ({"prompt": ["a", "b"]}, 400, "prompt[0]", "invalid_type"),
        ({"prompt": "x", "stream": "yes"}, 400, "stream", "invalid_type"),
        ({"max_tokens": 3}, 400, "prompt", "missing_required_parameter"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "messages", None),
        ({"model": "nope", "prompt": "x"}, 404, "model", "model_not_found"),
        ({"prompt": "x", "n": 2}, 400, "n", "invalid_value"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    ],
)
def test_completion_validation_errors(body, status, param, code):
    err = parse_error(body)
    assert (err.status, err.param, err.code) == (status, param, code)
    assert err.type == ("invalid_request_error")
    assert err.message


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"prompt": "x"}, "prompt", None),
        ({"messages": []}, "messages", "missing_required_parameter"),
        ({}, "messages", "missing_required_parameter"),
        ({"messages": [{"content": "no role"}]}, "messages[0]", "invalid_value"),
        ({"messages": [{"role": 1}]}, "messages[0].role", "invalid_type"),
    ],
)
def test_chat_validation_errors(body, param, code):
    err = parse_error(body, Endpoint.CHAT)
    assert (err.status, err.param, err.code) == (400, param, code)


def test_validation_message_is_msgspec_text():
    err = parse_error({"prompt": "x", "max_tokens": "ten"})
    assert err.message == "Expected `int | null`, got `str` - at `$.max_tokens`"


# ───────────────────────────── headers ─────────────────────────────


def test_nats_headers_forward_tier_tenant_and_bearer_key():
    http = {"X-Request-Tier": "P2", "x-tenant": "acme", "Authorization": "Bearer sk-1", "Cookie": "c"}
    assert core.nats_headers(http) == {"x-request-tier": "P2", "x-tenant": "acme", "x-api-key": "sk-1"}


def test_nats_headers_ignore_non_bearer_auth_and_empty_values():
    assert core.nats_headers({"Authorization": "Basic abc", "x-tenant": ""}) == {}
    assert core.nats_headers({"authorization": "bearer  k "}) == {"x-api-key": "k"}


def test_request_id_from_header_or_fresh():
    assert core.request_id_from("abc-1", "fresh") == "abc-1"
    assert core.request_id_from(None, "fresh") == "fresh"
    assert core.request_id_from("", "fresh") == "fresh"
    with pytest.raises(ApiError) as info:
        core.request_id_from("has space", "fresh")
    assert (info.value.status, info.value.param) == (400, "x-request-id")
    with pytest.raises(ApiError):
        core.request_id_from("x" * 129, "fresh")


# ───────────────────────────── errors ─────────────────────────────


def test_error_body_shape():
    err = ApiError(400, "bad", param="max_tokens", code="invalid_value")
    assert json.loads(err.body()) == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "invalid_value",
        }
    }
    assert err.headers() == {}


@pytest.mark.parametrize(
    ("event", "type_", "code", "headers", "outcome"),
    [
        (
            schemas.Rejected("r", 429, "rate_limit_exceeded", "slow down", retry_after_s=1.2),
            "rate_limit_exceeded",
            "rate_limit_exceeded",
            {"Retry-After": "2"},
            Outcome.REJECTED_RATE,
        ),
        (
            schemas.Rejected("r", 503, "", "fleet saturated", retry_after_s=0.0),
            "server_error",
            "overloaded",
            {"Retry-After": "0"},
            Outcome.REJECTED_CAPACITY,
        ),
        (
            schemas.Rejected("r", 404, "", "no model"),
            "invalid_request_error",
            "model_not_found",
            {},
            Outcome.REJECTED_INVALID,
        ),
        (
            schemas.Rejected("r", 400, "invalid_value", "too long"),
            "invalid_request_error",
            "invalid_value",
            {},
            Outcome.REJECTED_INVALID,
        ),
        (schemas.Error("r", 500, "engine died"), "server_error", None, {}, Outcome.FAILED),
    ],
)
def test_error_from_event(event, type_, code, headers, outcome):
    err = core.error_from_event(event)
    assert (err.status, err.type, err.code, err.message) == (event.status, type_, code, event.message)
    assert err.headers() == headers
    assert err.outcome() is outcome


def test_rejected_param_is_kept():
    err = core.error_from_event(schemas.Rejected("r", 400, "invalid_value", "m", param="max_tokens"))
    assert err.error_dict()["error"]["param"] == "max_tokens"


# ───────────────────────────── rendering ─────────────────────────────

USAGE = schemas.Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7, cached_tokens=4)
USAGE_DICT = {
    "prompt_tokens": 5,
    "completion_tokens": 2,
    "total_tokens": 7,
    "prompt_tokens_details": {"cached_tokens": 4},
}
EVENTS = [
    schemas.Accepted("r1", priority=1, prompt_tokens=5),
    schemas.Chunk("r1", 0, "He", [72, 101]),
    schemas.Chunk("r1", 1, "y", [121]),
    schemas.Finished("r1", 2, "length", USAGE),
]


def render(endpoint, **body):
    req = schemas.GenerateRequest(model="m1", request_id="r1", **body)
    r = core.Renderer(endpoint, req, created=1700000000)
    return r, [f for e in EVENTS for f in r.frames(e)]


def test_completion_stream_chunks():
    _, frames = render(Endpoint.COMPLETIONS, prompt="x", stream=True)
    head = {"id": "cmpl-r1", "object": "text_completion", "created": 1700000000, "model": "m1"}
    assert frames_json(frames) == [
        {**head, "choices": [{"index": 0, "text": "He", "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": "y", "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]},
        "[DONE]",
    ]


def test_chat_stream_chunks_with_usage():
    _, frames = render(Endpoint.CHAT, messages=[], stream=True, stream_options=schemas.StreamOptions(True))
    head = {"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m1"}

    def choice(delta, finish=None):
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }

    assert frames_json(frames) == [
        choice({"role": "assistant", "content": ""}),
        choice({"content": "He"}),
        choice({"content": "y"}),
        choice({}, "length"),
        {**head, "choices": [], "usage": USAGE_DICT},
        "[DONE]",
    ]


def test_chat_role_goes_with_first_content_when_no_accepted_seen():
    req = schemas.GenerateRequest(model="m1", request_id="r1", stream=True)
    r = core.Renderer(Endpoint.CHAT, req, created=0)
    (frame,) = r.frames(EVENTS[1])
    assert frames_json([frame])[0]["choices"][0]["delta"] == {"role": "assistant", "content": "He"}


def test_sse_framing_is_exact():
    req = schemas.GenerateRequest(model="m1", request_id="r1", stream=True)
    r = core.Renderer(Endpoint.COMPLETIONS, req, created=3)
    assert r.frames(EVENTS[1]) == [
        b'data: {"id":"cmpl-r1","object":"text_completion","created":3,"model":"m1",'
        b'"choices":[{"index":0,"text":"He","logprobs":null,"finish_reason":null}]}\n\n'
    ]
    assert r.frames(EVENTS[0]) == []
    assert r.frames(EVENTS[3])[-1] == b"data: [DONE]\n\n"


_texts = st.text(st.characters(codec="utf-8"), max_size=6)  # quotes, escapes, "\x00", non-ASCII, ""


@given(
    endpoint=st.sampled_from(list(Endpoint)),
    include_usage=st.booleans(),
    model=_texts,
    accepted=st.booleans(),
    texts=st.lists(_texts, max_size=6),
    cut=st.integers(0, 8),
)
def test_render_is_the_frames_of_each_event_byte_for_byte(endpoint, include_usage, model, accepted, texts, cut):
    """`render` (the edge's path: the chunk's constant bytes encoded once) writes exactly what
    `frames` writes event by event, however the events are grouped into calls."""
    options = schemas.StreamOptions(True) if include_usage else None
    req = schemas.GenerateRequest(model=model, request_id="r1", stream=True, stream_options=options)
    events: list = [schemas.Accepted("r1", 1, 5)] if accepted else []
    events += [schemas.Chunk("r1", i, t, [i]) for i, t in enumerate(texts)]
    events.append(schemas.Finished("r1", len(texts), "stop", schemas.Usage(5, len(texts), 5 + len(texts))))
    by_frames = core.Renderer(endpoint, req, created=7)
    by_render = core.Renderer(endpoint, req, created=7)
    expected = b"".join(f for e in events for f in by_frames.frames(e))
    assert by_render.render(events[:cut]) + by_render.render(events[cut:]) == expected


def test_error_mid_stream_is_an_error_frame_then_done():
    req = schemas.GenerateRequest(model="m1", request_id="r1", stream=True)
    r = core.Renderer(Endpoint.COMPLETIONS, req, created=0)
    assert frames_json(r.frames(schemas.Error("r1", 500, "worker lost"))) == [
        {"error": {"message": "worker lost", "type": "server_error", "param": None, "code": None}},
        "[DONE]",
    ]


def test_include_usage_needs_stream():
    req = schemas.GenerateRequest(model="m1", request_id="r1", stream_options=schemas.StreamOptions(True))
    assert not core.Renderer(Endpoint.CHAT, req, created=0).include_usage


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_non_streaming_response(endpoint):
    r = core.Renderer(endpoint, schemas.GenerateRequest(model="m1", request_id="r1"), created=9)
    for e in EVENTS:
        r.feed(e)
    if endpoint is Endpoint.CHAT:
        expected = {
            "id": "chatcmpl-r1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hey"},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
        }
    else:
        expected = {
            "id": "cmpl-r1",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "Hey", "logprobs": None, "finish_reason": "length"}],
        }
    assert r.response() == {**expected, "created": 9, "model": "m1", "usage": USAGE_DICT}


def test_non_streaming_rejection_raises_its_error():
    r = core.Renderer(Endpoint.COMPLETIONS, schemas.GenerateRequest(model="m1", request_id="r1"), created=0)
    with pytest.raises(ApiError) as info:
        r.feed(schemas.Rejected("r1", 503, "overloaded", "busy", retry_after_s=3))
    assert (info.value.status, info.value.headers()) == (503, {"Retry-After": "3"})


def test_models_list():
    assert core.models_list(["a", "b"], 5) == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 5, "owned_by": "tokenyard"},
            {"id": "b", "object": "model", "created": 5, "owned_by": "tokenyard"},
        ],
    }


def test_renderer_output_is_valid_for_msgspec_roundtrip():
    # every frame is one JSON document: no stray newlines inside the payload
    _, frames = render(Endpoint.CHAT, messages=[], stream=True)
    for f in frames:
        assert f.count(b"\n") == 2
        if f != core.SSE_DONE:
            msgspec.json.decode(f[6:-2])
