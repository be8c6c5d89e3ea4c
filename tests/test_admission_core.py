"""AdmissionCore.admit: validation in order, tokenization, the hash chain, the priority class."""

from __future__ import annotations

import pytest
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared import hashing, schemas
from tokenyard.shared.schemas import ChatMessage, GenerateRequest, PriorityClass, Rejected
from tokenyard.shared.tokenizer import ByteTokenizer

MODEL = "m1"


def core(**kw) -> AdmissionCore:
    cfg = AdmissionConfig(
        models=[MODEL, "m2"],
        max_model_len=64,
        block_size=4,
        default_max_tokens=16,
        default_chat_max_tokens=32,
        **kw,
    )
    return AdmissionCore(cfg, ByteTokenizer())


def admit(req: GenerateRequest, headers=None, c=None, **kw):
    args = {"reply_to": "_INBOX.1", "json": False, "headers": headers, "now": 100.0, "new_id": "gen-1"} | kw
    return (c or core()).admit(req, **args)


def rejected(req: GenerateRequest, headers=None, c=None, **kw) -> Rejected:
    out = admit(req, headers, c, **kw)
    assert isinstance(out, Rejected), out
    return out


def test_a_text_prompt_is_tokenized_hashed_and_admitted():
    out = admit(
        GenerateRequest(model="m2", prompt="abcdefghij", max_tokens=5, temperature=0.5, stop="\n", seed=3)
    )
    tokens = list(b"abcdefghij")
    assert out == schemas.AdmittedRequest(
        request_id="gen-1",
        reply_to="_INBOX.1",
        model="m2",
        prompt_token_ids=tokens,
        prompt_len=10,
        block_hashes=hashing.hash_chain(tokens, 4),
        block_size=4,
        max_tokens=5,
        priority=1,
        arrival_s=100.0,
        json=False,
        tenant="",
        declared_priority=0,
        sampling=schemas.Sampling(temperature=0.5, seed=3, stop=["\n"]),
        kind="completion",
        deadline_s=105.0,  # P1's 5 s; no worker reported a prefill rate, so no prefill term
    )
    assert len(out.block_hashes) == 2


def test_token_id_prompt_is_taken_as_is():
    out = admit(GenerateRequest(prompt=[1, 2, 3, 4, 256], max_tokens=1, request_id="r-9"))
    assert (out.request_id, out.model, out.prompt_token_ids, out.prompt_len) == (
        "r-9",
        MODEL,
        [1, 2, 3, 4, 256],
        5,
    )
    assert out.block_hashes == hashing.hash_chain([1, 2, 3, 4], 4)


def test_chat_messages_are_rendered_then_tokenized():
    out = admit(GenerateRequest(messages=[ChatMessage("user", "hi")]), json=True)
    text = "<|user|>\nhi\n<|assistant|>\n"
    assert out.prompt_token_ids == list(text.encode())
    assert out.kind == "chat"
    assert out.json is True
    # the chat default, capped by what the context leaves
    assert out.max_tokens == min(32, 64 - len(text))


def test_default_max_tokens_is_capped_by_the_context():
    assert admit(GenerateRequest(prompt="a" * 10)).max_tokens == 16
    assert admit(GenerateRequest(prompt="a" * 60)).max_tokens == 4
    assert admit(GenerateRequest(prompt="a" * 63)).max_tokens == 1


def test_max_completion_tokens_wins_over_max_tokens():
    assert admit(GenerateRequest(prompt="ab", max_tokens=9, max_completion_tokens=3)).max_tokens == 3


def test_replay_with_block_hashes_carries_them_unchanged():
    out = admit(GenerateRequest(block_hashes=[11, -12], prompt_len=9, max_tokens=2))
    assert (out.prompt_token_ids, out.prompt_len, out.block_hashes) == ([], 9, [11, -12])


@pytest.mark.parametrize(
    ("req", "param", "message"),
    [
        (GenerateRequest(request_id="bad id"), "request_id", "request_id must be 1-128 characters"),
        (GenerateRequest(request_id=""), "request_id", "request_id must be 1-128 characters"),
        (GenerateRequest(request_id="x" * 129), "request_id", "request_id must be 1-128 characters"),
        (GenerateRequest(), "prompt", "exactly one of 'prompt', 'messages' or 'block_hashes'"),
        (GenerateRequest(prompt="a", messages=[ChatMessage("user", "b")]), "prompt", "exactly one of"),
        (GenerateRequest(prompt="a", block_hashes=[1], prompt_len=4), "prompt", "exactly one of"),
        (GenerateRequest(prompt="a", n=2), "n", "only n = 1 is supported"),
        (GenerateRequest(prompt="a", temperature=2.5), "temperature", "temperature must be between 0 and 2"),
        (GenerateRequest(prompt="a", temperature=-0.1), "temperature", "temperature must be between 0 and 2"),
        (GenerateRequest(prompt="a", top_p=0.0), "top_p", "top_p must be in (0, 1]"),
        (GenerateRequest(prompt="a", top_p=1.01), "top_p", "top_p must be in (0, 1]"),
        (GenerateRequest(prompt="a", max_tokens=0), "max_tokens", "max_tokens must be at least 1, got 0"),
        (GenerateRequest(prompt="a", max_completion_tokens=-1, max_tokens=5), "max_tokens", "got -1"),
        (GenerateRequest(prompt=""), "prompt", "the prompt is empty"),
        (GenerateRequest(prompt=[]), "prompt", "the prompt is empty"),
        (GenerateRequest(prompt=[1, 257]), "prompt", "prompt token ids must be in [0, 257)"),
        (GenerateRequest(prompt=[-1]), "prompt", "prompt token ids must be in [0, 257)"),
        (GenerateRequest(messages=[]), "messages", "messages must not be empty"),
        (GenerateRequest(messages=[ChatMessage("robot", "x")]), "messages", "unknown message role 'robot'"),
        (
            GenerateRequest(messages=[ChatMessage("user", [{"type": "image_url"}])]),
            "messages",
            "only text content parts are supported",
        ),
        (GenerateRequest(block_hashes=[1]), "prompt", "a replay with block_hashes needs prompt_len ≥ 1"),
        (GenerateRequest(block_hashes=[1], prompt_len=0), "prompt", "needs prompt_len ≥ 1"),
        (
            GenerateRequest(block_hashes=[1, 2], prompt_len=7),
            "prompt",
            "block_hashes cover more tokens than prompt_len",
        ),
    ],
)
def test_invalid_requests_get_a_400_naming_the_parameter(req, param, message):
    out = rejected(req)
    assert (out.status, out.code, out.param) == (400, "invalid_value", param)
    assert message in out.message
    assert out.request_id == (req.request_id or "gen-1")


def test_an_unknown_model_is_a_404():
    out = rejected(GenerateRequest(model="gpt-x", prompt="a"))
    assert out == Rejected("gen-1", 404, "model_not_found", "The model 'gpt-x' does not exist", "model")


def test_prompt_plus_max_tokens_over_the_context_is_context_length_exceeded():
    out = rejected(GenerateRequest(prompt="a" * 60, max_tokens=5))
    assert out == Rejected(
        "gen-1",
        400,
        "context_length_exceeded",
        "This model's maximum context length is 64 tokens; the request has 60 prompt tokens and asks for 5 more",
        "prompt",
    )
    assert admit(GenerateRequest(prompt="a" * 60, max_tokens=4)).max_tokens == 4
    # a prompt filling the whole context leaves no room even for the default
    assert rejected(GenerateRequest(prompt="a" * 64)).code == "context_length_exceeded"
    chat = rejected(GenerateRequest(messages=[ChatMessage("user", "a" * 60)], max_tokens=1))
    assert (chat.code, chat.param) == ("context_length_exceeded", "messages")


def test_a_missing_reply_subject_is_refused():
    out = rejected(GenerateRequest(prompt="a"), reply_to="")
    assert (out.status, out.param) == (400, "reply_to")


def test_the_first_failing_check_is_the_answer():
    # bad id, no prompt and a bad model all at once: the id is checked first
    assert rejected(GenerateRequest(request_id="a b", model="nope")).param == "request_id"
    # shape before model, model before sampling
    assert rejected(GenerateRequest(model="nope")).param == "prompt"
    assert rejected(GenerateRequest(model="nope", prompt="a", temperature=9)).param == "model"


# ───────────────────────────── priority class ─────────────────────────────


def cls(req: GenerateRequest, headers=None, c=None) -> int:
    out = admit(req, headers, c)
    assert isinstance(out, schemas.AdmittedRequest), out
    return out.priority


def test_undeclared_priority_gets_the_default_class():
    assert cls(GenerateRequest(prompt="a")) == PriorityClass.P1


@pytest.mark.parametrize(("declared", "expected"), [(2, 2), (3, 3), (7, 3), (1, 1), (-5, 1)])
def test_declared_priority_is_clamped_and_capped_by_the_default_ceiling(declared, expected):
    assert cls(GenerateRequest(prompt="a", priority=declared)) == expected


@pytest.mark.parametrize(("tier", "expected"), [("P2", 2), ("p3", 3), (" 2 ", 2), ("P0", 1), ("1", 1)])
def test_tier_header_wins_over_declared_priority(tier, expected):
    assert cls(GenerateRequest(prompt="a", priority=3), {"x-request-tier": tier}) == expected


@pytest.mark.parametrize("tier", ["P4", "gold", "", "PP1"])
def test_a_bad_tier_header_is_refused(tier):
    out = rejected(GenerateRequest(prompt="a"), {"x-request-tier": tier})
    assert (out.status, out.param) == (400, "x-request-tier")
    assert out.message == f"x-request-tier must be one of P0, P1, P2, P3; got '{tier}'"


def test_a_tenant_with_a_p0_ceiling_may_reach_p0():
    c = core(tenant_ceiling={"vip": PriorityClass.P0, "bulk": PriorityClass.P2})
    assert cls(GenerateRequest(prompt="a", priority=-1, tenant="vip"), c=c) == 0
    assert cls(GenerateRequest(prompt="a"), {"x-request-tier": "P0", "x-tenant": "vip"}, c=c) == 0
    assert cls(GenerateRequest(prompt="a", user="vip"), {"x-request-tier": "P0"}, c=c) == 0
    # a tenant cannot lift itself above its ceiling
    assert cls(GenerateRequest(prompt="a", tenant="bulk"), {"x-request-tier": "P0"}, c=c) == 2
    assert cls(GenerateRequest(prompt="a", tenant="someone"), {"x-request-tier": "P0"}, c=c) == 1


def test_tenant_comes_from_header_then_field_then_user():
    assert admit(GenerateRequest(prompt="a", tenant="t", user="u"), {"x-tenant": "h"}).tenant == "h"
    assert admit(GenerateRequest(prompt="a", tenant="t", user="u")).tenant == "t"
    assert admit(GenerateRequest(prompt="a", user="u")).tenant == "u"


def test_declared_priority_is_kept_for_later_hops():
    out = admit(GenerateRequest(prompt="a", priority=2))
    assert (out.priority, out.declared_priority) == (2, 2)


def test_admission_is_deterministic():
    req = GenerateRequest(prompt="hello world, hello world", max_tokens=3, priority=2)
    assert admit(req) == admit(req)
