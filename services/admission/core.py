"""Admission's core: validate, price, rate-limit, judge SLO feasibility, tokenize once, hash.

    verdict = admit(request, headers, now)  →  AdmittedRequest | Rejected

Checks run in order, and the first failure is the answer (nothing is half-admitted: a
rejected request leaves no trace in any queue, bucket or counter):
  1. shape: exactly one of prompt / messages, or block_hashes + prompt_len (trace replay);
     n = 1; request id well-formed;
  2. model served (404 model_not_found);
  3. sampling values in range (temperature ∈ [0, 2], top_p ∈ (0, 1], max_tokens ≥ 1);
  4. tenant (tenants.py: an API key maps to its tenant; 401 for an unknown key when keys
     are configured) and class: tenant pin, else `x-request-tier`, else the declared
     `priority` (vLLM's field, clamped to P0…P3), else the tenant's default, never above
     the tenant's ceiling (a tenant cannot lift itself to P0);
  5. SLO feasibility (feasibility.py): the predicted wait for the class against the TTFT
     deadline → 503 overloaded, Retry-After, queue depth. Before any tokenizing, so the
     refusals an overload produces in bulk cost microseconds;
  6. token buckets, first on a lower bound of the price (max_tokens + 1) so a client over
     its rate is also refused before tokenizing: 429 (tenant's bucket) or 503 (global);
  7. tokenize, block-hash chain (shared.hashing); prompt tokens in the vocabulary;
     prompt + max_tokens ≤ max_model_len (400 context_length_exceeded); the prompt's own
     prefill on the fastest worker fits the TTFT target (400 slo_infeasible, feasibility.py);
  8. token buckets on the exact price prompt + max_tokens; both are charged together only
     now, when the request is admitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tokenyard.services.admission.feasibility import FleetView
from tokenyard.services.admission.tenants import TenantPolicy, TenantTable
from tokenyard.services.admission.token_bucket import TokenBucket
from tokenyard.shared import config, hashing, schemas
from tokenyard.shared.schemas import GenerateRequest, Heartbeat, PriorityClass, QueueStats, Rejected
from tokenyard.shared.slo import ENGINE_BACKLOG_S, TTFT_TARGET_S
from tokenyard.shared.tokenizer import Tokenizer, content_text, render_chat

_REQUEST_ID = re.compile(r"^[A-Za-z0-9_\-.:]{1,128}$")
TIER_HEADER = "x-request-tier"
TENANT_HEADER = "x-tenant"
API_KEY_HEADER = "x-api-key"


@dataclass
class AdmissionConfig:
    models: list[str] = field(default_factory=lambda: [config.DEFAULT_MODEL])
    max_model_len: int = config.MAX_MODEL_LEN
    block_size: int = config.BLOCK_SIZE
    default_max_tokens: int = config.DEFAULT_MAX_TOKENS
    default_chat_max_tokens: int = config.DEFAULT_CHAT_MAX_TOKENS
    default_class: PriorityClass = PriorityClass.P1
    tenant_ceiling: dict[str, PriorityClass] = field(default_factory=dict)
    """tenant → the highest class it may reach; tenants not listed get default_ceiling
    (shorthand for TenantTable entries that only set a ceiling)."""
    default_ceiling: PriorityClass = PriorityClass.P1
    tenants: TenantTable | None = None
    """Tenant policies, API keys and rates (tenants.py); None: built from the fields above."""
    slo_check: bool = True

    def table(self) -> TenantTable:
        if self.tenants is not None:
            return self.tenants
        default = TenantPolicy(ceiling=self.default_ceiling, default_class=self.default_class)
        per_tenant = {t: TenantPolicy(ceiling=c, default_class=self.default_class) for t, c in self.tenant_ceiling.items()}
        return TenantTable(tenants=per_tenant, default=default)


class AdmissionCore:
    def __init__(self, cfg: AdmissionConfig, tokenizer: Tokenizer):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.table = cfg.table()
        self.fleet = FleetView()
        t = self.table
        self.global_bucket = (
            TokenBucket(t.global_rate_tokens_per_s, t.global_burst_tokens or 2 * t.global_rate_tokens_per_s)
            if t.global_rate_tokens_per_s else None
        )
        self.buckets: dict[str, TokenBucket] = {}
        """Per-tenant buckets, created on a tenant's first admitted request."""

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.fleet.on_heartbeat(hb, now)

    def on_queue_stats(self, stats: QueueStats, now: float) -> None:
        self.fleet.on_queue_stats(stats, now)

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
        if req.ttft_slo_ms is not None and req.ttft_slo_ms <= 0:
            return bad("ttft_slo_ms must be positive", "ttft_slo_ms")
        if req.tpot_slo_ms is not None and req.tpot_slo_ms <= 0:
            return bad("tpot_slo_ms must be positive", "tpot_slo_ms")

        key = headers.get(API_KEY_HEADER)
        if key is not None and self.table.api_keys and key not in self.table.api_keys:
            return bad("Incorrect API key provided", None, "invalid_api_key", 401)
        tenant = (self.table.api_keys.get(key or "") or headers.get(TENANT_HEADER) or req.tenant
                  or req.user or "")
        policy = self.table.policy(tenant)
        priority = self._priority_class(req, headers, policy)
        if isinstance(priority, str):
            return bad(priority, TIER_HEADER)

        deadline_s = req.ttft_slo_ms / 1000.0 if req.ttft_slo_ms is not None else None
        if self.cfg.slo_check:
            verdict = self.fleet.judge(int(priority), deadline_s, now)
            if verdict is not None and not verdict.feasible:
                return self._overloaded(rid, priority, verdict.wait_s, verdict.deadline_s,
                                        verdict.retry_after_s, verdict.depth, now)

        floor = (max_tokens or 0) + 1  # the least this request can cost
        refusal = self._rate_check(rid, tenant, policy, floor, now)
        if refusal is not None:
            return refusal

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
        if self.cfg.slo_check:
            own = self.fleet.own_prefill_s(prompt_len, now)
            target = deadline_s if deadline_s is not None else TTFT_TARGET_S[int(priority)]
            if own is not None and own + ENGINE_BACKLOG_S > target:
                return bad(
                    f"A P{int(priority)} request's {prompt_len}-token prompt takes about {own:.1f} s to "
                    f"prefill, beyond its {target:g} s TTFT target; ask for a class with a looser target "
                    f"({TIER_HEADER}) or a larger ttft_slo_ms",
                    "messages" if kind == "chat" else "prompt", "slo_infeasible",
                )
        price = prompt_len + max_tokens
        refusal = self._rate_check(rid, tenant, policy, price, now)
        if refusal is not None:
            return refusal
        self._charge(tenant, policy, price, now)
        self.fleet.on_admitted(int(priority), price, prompt_len)

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
            deadline_s=now + deadline_s if deadline_s is not None else 0.0,
            tpot_slo_ms=req.tpot_slo_ms or 0.0,
        )

    # ── refusals: computed from state, changing none ──
    def _overloaded(self, rid: str, priority: PriorityClass, wait: float, deadline: float,
                    retry_after: float, depth: int, now: float) -> Rejected:
        wait_text = "no capacity to serve it" if wait == float("inf") else f"a predicted wait of {wait:.2f} s"
        return Rejected(
            request_id=rid, status=503, code="overloaded",
            message=f"Fleet saturated: a P{int(priority)} request faces {wait_text} against its "
                    f"{deadline:g} s TTFT target ({depth} requests queued); retry later",
            retry_after_s=retry_after if retry_after != float("inf") else self.fleet.stale_after_s,
            queue_depth=depth,
        )

    def _tenant_bucket(self, tenant: str, policy: TenantPolicy) -> TokenBucket | None:
        if policy.rate_tokens_per_s is None:
            return None
        bucket = self.buckets.get(tenant)
        if bucket is None:  # a fresh bucket is full: not stored until the tenant is charged
            bucket = TokenBucket(policy.rate_tokens_per_s, policy.burst_tokens or 2 * policy.rate_tokens_per_s)
        return bucket

    def _rate_check(self, rid: str, tenant: str, policy: TenantPolicy, price: float, now: float) -> Rejected | None:
        bucket = self._tenant_bucket(tenant, policy)
        if bucket is not None:
            wait = bucket.wait(price, now)
            if wait > 0:
                if wait == float("inf"):
                    return Rejected(
                        request_id=rid, status=413, code="request_too_large",
                        message=f"The request costs {price} tokens, more than tenant '{tenant}' may spend at once "
                                f"({bucket.burst:g})",
                    )
                return Rejected(
                    request_id=rid, status=429, code="rate_limit_exceeded",
                    message=f"Rate limit reached for tenant '{tenant}': {bucket.rate:g} tokens/s; the request "
                            f"costs {price} tokens (prompt + max_tokens)",
                    retry_after_s=wait, queue_depth=self.fleet.depth(now),
                )
        if self.global_bucket is not None:
            wait = self.global_bucket.wait(price, now)
            if wait > 0:
                return Rejected(
                    request_id=rid, status=503, code="overloaded",
                    message=f"Fleet saturated: the global budget of {self.global_bucket.rate:g} tokens/s is spent",
                    retry_after_s=wait if wait != float("inf") else None, queue_depth=self.fleet.depth(now),
                )
        return None

    def _charge(self, tenant: str, policy: TenantPolicy, price: float, now: float) -> None:
        bucket = self._tenant_bucket(tenant, policy)
        if bucket is not None:
            bucket.take(price, now)
            self.buckets[tenant] = bucket
        if self.global_bucket is not None:
            self.global_bucket.take(price, now)

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

    def _priority_class(self, req: GenerateRequest, headers: dict[str, str], policy: TenantPolicy) -> PriorityClass | str:
        tier = headers.get(TIER_HEADER)
        if tier is not None:
            name = tier.strip().upper().removeprefix("P")
            if name not in ("0", "1", "2", "3"):
                return f"{TIER_HEADER} must be one of P0, P1, P2, P3; got '{tier}'"
        if policy.pinned_class is not None:
            wanted = policy.pinned_class
        elif tier is not None:
            wanted = PriorityClass(int(tier.strip().upper().removeprefix("P")))
        elif req.priority != 0:  # 0 is vLLM's default: "not declared"
            wanted = PriorityClass(min(max(req.priority, 0), 3))
        else:
            wanted = policy.default_class
        return PriorityClass(max(wanted, policy.ceiling))
