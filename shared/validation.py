"""What makes a generation request valid, and its tokens: one home for both, used by admission
(every request, NATS or HTTP), the edge (what it can judge without a tokenizer) and a worker's
own HTTP front (everything, as admission would). Pure: no I/O, no clock.

    check(req, limits)                     → Checked | Invalid     shape, model, sampling ranges
    tokenize(req, checked, tokenizer, lim) → Prepared | Invalid    tokens, prompt length, block
                                                                   chain, max_tokens, context
Admission runs its cheap refusals (SLO feasibility, rate on a lower bound of the price) between
the two, so that an overload's refusals never pay for tokenizing.

    max_tokens   = max_completion_tokens ?? max_tokens ?? min(default, max_model_len − prompt_len)
    context      : prompt_len + max_tokens ≤ max_model_len              (400 context_length_exceeded)
    replay       : block_hashes + prompt_len, len(block_hashes) · block_size ≤ prompt_len
    sampling     : temperature, top_p, penalties, top_k, min_p, min_tokens in vLLM's ranges
                   (SAMPLING_RANGES and check's own), carried to the engine (schemas.Sampling)
    unsupported  : a field of UNSUPPORTED other than a value that asks for nothing (400
                   unsupported_parameter, naming it): no engine here honours it, and an answer
                   made without it would look right and not be what was asked for
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import msgspec
from tokenyard.shared import config, hashing, schemas
from tokenyard.shared.schemas import GenerateRequest
from tokenyard.shared.tokenizer import Tokenizer, content_text, render_chat

REQUEST_ID = re.compile(r"^[A-Za-z0-9_\-.:]{1,128}$")
REQUEST_ID_RULE = "1-128 characters of [A-Za-z0-9_-.:]"
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")

UNSUPPORTED: dict[str, tuple[object, ...]] = {
    # OpenAI's completions and chat fields no engine here honours → the values that ask for
    # nothing, which pass (clients send some of them always: null, false, n's 1 …)
    "logprobs": (None, False),  # completions: an int 0-5; chat: a bool
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
"""Accepted and ignored, as they change nothing in an answer: `parallel_tool_calls` (no tools),
`store`, `metadata`, `service_tier`, `prediction`, `prompt_cache_key`, `safety_identifier` (not
declared on GenerateRequest: the decoder skips them). `user` is read (a tenant, by admission)."""


SAMPLING_RANGES: dict[str, tuple[float, float, str]] = {
    # the sampling vLLM applies, in the ranges it accepts (its SamplingParams raises outside them)
    "presence_penalty": (-2.0, 2.0, "between -2 and 2"),
    "frequency_penalty": (-2.0, 2.0, "between -2 and 2"),
    "min_p": (0.0, 1.0, "between 0 and 1"),
}


def asks_nothing(value: object, accepted: tuple[object, ...]) -> bool:
    """`value` is one of `accepted`, type for type (False is not 0, 0 is not 0.0 …, as JSON
    tells them apart; a float field decodes 0 as 0.0)."""
    return any(type(value) is type(a) and value == a for a in accepted)


def _unsupported(req: GenerateRequest) -> Invalid | None:
    for name, accepted in UNSUPPORTED.items():
        value = getattr(req, name)
        if value is not None and not asks_nothing(value, accepted):
            allowed = " or ".join(msgspec.json.encode(a).decode() for a in accepted)
            return Invalid(400, f"`{name}` is not supported (leave it out, or send {allowed})", name,
                           "unsupported_parameter")
    return None


@dataclass(frozen=True)
class Limits:
    models: tuple[str, ...] = (config.DEFAULT_MODEL,)
    """Served model names; empty: any name (the first request's model is not checked)."""
    max_model_len: int = config.MAX_MODEL_LEN
    block_size: int = config.BLOCK_SIZE
    default_max_tokens: int = config.DEFAULT_MAX_TOKENS
    default_chat_max_tokens: int = config.DEFAULT_CHAT_MAX_TOKENS


@dataclass(frozen=True)
class Invalid:
    """Why a request is refused: an HTTP status and OpenAI's error fields."""

    status: int
    message: str
    param: str | None = None
    code: str = "invalid_value"

    def rejected(self, request_id: str) -> schemas.Rejected:
        return schemas.Rejected(request_id=request_id, status=self.status, code=self.code, message=self.message,
                                param=self.param)


@dataclass(frozen=True)
class Checked:
    model: str
    """The model served (a request naming none gets the first served)."""
    kind: str
    """`chat` or `completion`."""
    max_tokens: int | None
    """As asked (max_completion_tokens first); None: the default, known once tokenized."""

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


@dataclass(frozen=True)
class Prepared:
    tokens: list[int]
    """Prompt token ids (empty for a trace replay, which has only hashes)."""
    prompt_len: int
    chain: list[int]
    """Block-hash chain of the full blocks (shared.hashing)."""
    max_tokens: int


def json_schema_rules(limits: Limits) -> dict[str, dict]:
    """The rules `check` enforces, as JSON Schema keywords per field, for the OpenAPI document
    (a client reads them there; schemathesis generates valid requests from them)."""
    rules: dict[str, dict] = {
        "n": {"minimum": 1, "maximum": 1},
        "temperature": {"minimum": 0.0, "maximum": 2.0},
        "top_p": {"exclusiveMinimum": 0.0, "maximum": 1.0},
        **{name: {"minimum": lo, "maximum": hi} for name, (lo, hi, _) in SAMPLING_RANGES.items()},
        "repetition_penalty": {"exclusiveMinimum": 0.0, "maximum": 2.0},
        "top_k": {"minimum": -1},
        "min_tokens": {"minimum": 0, "maximum": limits.max_model_len},
        "stop": {"minLength": 1, "items": {"type": "string", "minLength": 1}},  # the string, or each string
        "max_tokens": {"minimum": 1, "maximum": limits.max_model_len},
        "max_completion_tokens": {"minimum": 1, "maximum": limits.max_model_len},
        "request_id": {"pattern": REQUEST_ID.pattern},
        "ttft_slo_ms": {"exclusiveMinimum": 0.0},
        "tpot_slo_ms": {"exclusiveMinimum": 0.0},
        "messages": {"minItems": 1},
        "prompt_len": {"minimum": 1},
    }
    if limits.models:
        rules["model"] = {"enum": list(limits.models)}
    return rules


def check(req: GenerateRequest, limits: Limits) -> Checked | Invalid:
    """Everything that needs no tokenizer, in the order a client fixes them."""
    if req.request_id is not None and not REQUEST_ID.match(req.request_id):
        return Invalid(400, f"request_id must be {REQUEST_ID_RULE}", "request_id")
    given = (req.prompt is not None) + (req.messages is not None) + (req.block_hashes is not None)
    if given != 1:
        return Invalid(400, "exactly one of 'prompt', 'messages' or 'block_hashes' must be given", "prompt")
    if req.n != 1:
        return Invalid(400, "only n = 1 is supported", "n")
    if (unsupported := _unsupported(req)) is not None:
        return unsupported
    model = req.model or (limits.models[0] if limits.models else "")
    if limits.models and model not in limits.models:
        return Invalid(404, f"The model '{model}' does not exist", "model", "model_not_found")
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        return Invalid(400, "temperature must be between 0 and 2", "temperature")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        return Invalid(400, "top_p must be in (0, 1]", "top_p")
    for name, (lo, hi, rule) in SAMPLING_RANGES.items():
        value = getattr(req, name)
        if value is not None and not lo <= value <= hi:
            return Invalid(400, f"{name} must be {rule}, got {value}", name)
    if req.repetition_penalty is not None and not 0.0 < req.repetition_penalty <= 2.0:
        return Invalid(400, f"repetition_penalty must be in (0, 2], got {req.repetition_penalty}", "repetition_penalty")
    if req.top_k is not None and req.top_k < -1:
        return Invalid(400, f"top_k must be -1 or 0 (no cut) or a positive count, got {req.top_k}", "top_k")
    if req.stop == "" or (isinstance(req.stop, list) and "" in req.stop):  # vLLM's SamplingParams raises on it
        return Invalid(400, "stop cannot contain an empty string", "stop")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_tokens"  # OpenAI's newer name, max_completion_tokens, is the same limit
    if max_tokens is not None and max_tokens < 1:
        return Invalid(400, f"max_tokens must be at least 1, got {max_tokens}", param)
    if req.min_tokens is not None and not 0 <= req.min_tokens <= (max_tokens or limits.max_model_len):
        return Invalid(400, f"min_tokens must be between 0 and max_tokens, got {req.min_tokens}", "min_tokens")
    if max_tokens is not None and max_tokens > limits.max_model_len:
        return Invalid(400, f"max_tokens must be at most the model's context length {limits.max_model_len}, "
                            f"got {max_tokens}", param, "context_length_exceeded")
    for name in ("ttft_slo_ms", "tpot_slo_ms"):
        value = getattr(req, name)
        if value is not None and not (0.0 < value < math.inf):
            return Invalid(400, f"{name} must be a positive number of milliseconds", name)
    if req.messages is not None and not req.messages:
        return Invalid(400, "messages must not be empty", "messages")
    return Checked(model, "chat" if req.messages is not None else "completion", max_tokens)


def sampling(req: GenerateRequest) -> schemas.Sampling:
    """The request's sampling as its engine gets it (`stop` as a list), for admission and a
    worker's own HTTP front alike."""
    extras = {f: getattr(req, f) for f in schemas.VllmSampling.__struct_fields__}
    return schemas.Sampling(temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                            stop=[req.stop] if isinstance(req.stop, str) else req.stop,
                            ignore_eos=req.ignore_eos, **extras)


def tokenize(req: GenerateRequest, checked: Checked, tokenizer: Tokenizer, limits: Limits) -> Prepared | Invalid:
    """Token ids, prompt length, block-hash chain and the max_tokens to run with."""
    try:
        tokens, prompt_len, chain = _tokens(req, tokenizer, limits.block_size)
    except ValueError as e:
        return Invalid(400, str(e), checked.prompt_param)
    if prompt_len == 0:
        return Invalid(400, "the prompt is empty", checked.prompt_param)
    max_tokens = checked.max_tokens
    if max_tokens is None:
        default = limits.default_chat_max_tokens if checked.kind == "chat" else limits.default_max_tokens
        max_tokens = max(1, min(default, limits.max_model_len - prompt_len))
    if req.min_tokens is not None and req.min_tokens > max_tokens:  # vLLM's SamplingParams raises on it
        return Invalid(400, f"min_tokens ({req.min_tokens}) is more than max_tokens ({max_tokens})", "min_tokens")
    if prompt_len + max_tokens > limits.max_model_len:
        return Invalid(
            400,
            f"This model's maximum context length is {limits.max_model_len} tokens; the request has "
            f"{prompt_len} prompt tokens and asks for {max_tokens} more",
            checked.prompt_param,
            "context_length_exceeded",
        )
    return Prepared(tokens, prompt_len, chain, max_tokens)


def _tokens(req: GenerateRequest, tokenizer: Tokenizer, block_size: int) -> tuple[list[int], int, list[int]]:
    if req.block_hashes is not None:
        if req.prompt_len is None or req.prompt_len < 1:
            raise ValueError("a replay with block_hashes needs prompt_len ≥ 1")
        if len(req.block_hashes) * block_size > req.prompt_len:
            raise ValueError("block_hashes cover more tokens than prompt_len")
        return [], req.prompt_len, list(req.block_hashes)
    if req.messages is not None:
        for m in req.messages:
            if m.role not in CHAT_ROLES:
                raise ValueError(f"unknown message role '{m.role}'")
            content_text(m.content)
        tokens = tokenizer.encode(render_chat(req.messages))
    elif isinstance(req.prompt, str):
        tokens = tokenizer.encode(req.prompt)
    else:
        tokens = list(req.prompt or [])
        vocab = tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in tokens):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
    return tokens, len(tokens), hashing.hash_chain(tokens, block_size)
