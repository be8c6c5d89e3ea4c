"""Admission's core: validate, tokenize once, hash, resolve the priority class.

    verdict = admit(request, headers, now)  →  AdmittedRequest | Rejected

Checks run in order, and the first failure is the answer (nothing is half-admitted: a
rejected request leaves no trace in any queue):
  1. shape: exactly one of prompt / messages, or block_hashes + prompt_len (trace replay);
     n = 1; request id well-formed;
  2. model served (404 model_not_found);
  3. sampling values in range (temperature ∈ [0, 2], top_p ∈ (0, 1], max_tokens ≥ 1);
  4. prompt tokens in the vocabulary; prompt + max_tokens ≤ max_model_len
     (400 context_length_exceeded, as OpenAI answers).
Then the prompt is tokenized, its block-hash chain computed (shared.hashing), and the class
resolved: tier header `x-request-tier` if given, else the declared `priority` (vLLM's field,
clamped to P0…P3), never above the tenant's ceiling (a tenant cannot lift itself to P0).
Rate limits and SLO feasibility (issue 7) land here as further checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared import config, hashing, schemas
from shared.schemas import GenerateRequest, PriorityClass, Rejected
from shared.tokenizer import Tokenizer, content_text, render_chat

_REQUEST_ID = re.compile(r"^[A-Za-z0-9_\-.:]{1,128}$")
TIER_HEADER = "x-request-tier"
TENANT_HEADER = "x-tenant"


@dataclass
class AdmissionConfig:
    models: list[str] = field(default_factory=lambda: [config.DEFAULT_MODEL])
    max_model_len: int = config.MAX_MODEL_LEN
    block_size: int = config.BLOCK_SIZE
    default_max_tokens: int = config.DEFAULT_MAX_TOKENS
    default_chat_max_tokens: int = config.DEFAULT_CHAT_MAX_TOKENS
    default_class: PriorityClass = PriorityClass.P1
    tenant_ceiling: dict[str, PriorityClass] = field(default_factory=dict)
    """tenant → the highest class it may reach; tenants not listed get default_ceiling."""
    default_ceiling: PriorityClass = PriorityClass.P1


class AdmissionCore:
    def __init__(self, cfg: AdmissionConfig, tokenizer: Tokenizer):
        self.cfg = cfg
        self.tokenizer = tokenizer

    def admit(
        self,
        req: GenerateRequest,
        *,
        reply_to: str,
        json: bool,
        headers: dict[str, str] | None,
        now: float,
        new_id: str,
    ) -> schemas.AdmittedRequest | Rejected:
        headers = headers or {}
        rid = req.request_id or new_id

        def bad(message: str, param: str | None = None, code: str = "invalid_value", status: int = 400) -> Rejected:
            return Rejected(request_id=rid, status=status, code=code, message=message, param=param)

        if req.request_id is not None and not _REQUEST_ID.match(req.request_id):
            return bad("request_id must be 1-128 characters of [A-Za-z0-9_-.:]", "request_id")
        if not reply_to:
            return bad("a reply subject is required: the request's stream goes there", "reply_to")
        replay = req.block_hashes is not None
        given = sum(x is not None for x in (req.prompt, req.messages)) + replay
        if given != 1:
            return bad("exactly one of 'prompt', 'messages' or 'block_hashes' must be given", "prompt")
        if req.n != 1:
            return bad("only n = 1 is supported", "n")
        model = req.model or self.cfg.models[0]
        if model not in self.cfg.models:
            return bad(f"The model '{model}' does not exist", "model", "model_not_found", 404)
        if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
            return bad("temperature must be between 0 and 2", "temperature")
        if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
            return bad("top_p must be in (0, 1]", "top_p")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is not None and max_tokens < 1:
            return bad(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")

        kind = "chat" if req.messages is not None else "completion"
        try:
            tokens, prompt_len, chain = self._tokens(req)
        except ValueError as e:
            return bad(str(e), "messages" if kind == "chat" else "prompt")
        if prompt_len == 0:
            return bad("the prompt is empty", "prompt")
        if max_tokens is None:
            default = self.cfg.default_chat_max_tokens if kind == "chat" else self.cfg.default_max_tokens
            max_tokens = max(1, min(default, self.cfg.max_model_len - prompt_len))
        if prompt_len + max_tokens > self.cfg.max_model_len:
            return bad(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens; the request has "
                f"{prompt_len} prompt tokens and asks for {max_tokens} more",
                "messages" if kind == "chat" else "prompt",
                "context_length_exceeded",
            )

        tenant = headers.get(TENANT_HEADER) or req.tenant or req.user or ""
        priority = self._priority_class(req, headers, tenant)
        if isinstance(priority, str):
            return bad(priority, TIER_HEADER)
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        return schemas.AdmittedRequest(
            request_id=rid,
            reply_to=reply_to,
            model=model,
            prompt_token_ids=tokens,
            prompt_len=prompt_len,
            block_hashes=chain,
            block_size=self.cfg.block_size,
            max_tokens=max_tokens,
            priority=int(priority),
            arrival_s=now,
            json=json,
            tenant=tenant,
            declared_priority=req.priority,
            sampling=schemas.Sampling(
                temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=stop, ignore_eos=req.ignore_eos
            ),
            kind=kind,
        )

    def _tokens(self, req: GenerateRequest) -> tuple[list[int], int, list[int]]:
        """Token ids, prompt length and block-hash chain; raises ValueError on bad content."""
        if req.block_hashes is not None:
            if req.prompt_len is None or req.prompt_len < 1:
                raise ValueError("a replay with block_hashes needs prompt_len ≥ 1")
            if len(req.block_hashes) * self.cfg.block_size > req.prompt_len:
                raise ValueError("block_hashes cover more tokens than prompt_len")
            return [], req.prompt_len, list(req.block_hashes)
        if req.messages is not None:
            if not req.messages:
                raise ValueError("messages must not be empty")
            for m in req.messages:
                if m.role not in ("system", "user", "assistant", "tool", "developer"):
                    raise ValueError(f"unknown message role '{m.role}'")
                content_text(m.content)
            tokens = self.tokenizer.encode(render_chat(req.messages))
        elif isinstance(req.prompt, str):
            tokens = self.tokenizer.encode(req.prompt)
        else:
            tokens = list(req.prompt or [])
            vocab = self.tokenizer.vocab_size
            if any(not 0 <= t < vocab for t in tokens):
                raise ValueError(f"prompt token ids must be in [0, {vocab})")
        return tokens, len(tokens), hashing.hash_chain(tokens, self.cfg.block_size)

    def _priority_class(self, req: GenerateRequest, headers: dict[str, str], tenant: str) -> PriorityClass | str:
        tier = headers.get(TIER_HEADER)
        if tier is not None:
            name = tier.strip().upper().removeprefix("P")
            if name not in ("0", "1", "2", "3"):
                return f"{TIER_HEADER} must be one of P0, P1, P2, P3; got '{tier}'"
            wanted = PriorityClass(int(name))
        elif req.priority != 0:  # 0 is vLLM's default: "not declared"
            wanted = PriorityClass(min(max(req.priority, 0), 3))
        else:
            wanted = self.cfg.default_class
        ceiling = self.cfg.tenant_ceiling.get(tenant, self.cfg.default_ceiling)
        return PriorityClass(max(wanted, ceiling))
