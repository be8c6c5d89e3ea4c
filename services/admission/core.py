"""Admission's core: validate, price, rate-limit, judge SLO feasibility, tokenize once, hash.

    verdict = admit(request, headers, now)  →  AdmittedRequest | Rejected

Checks run in order, and the first failure is the answer (nothing is half-admitted: a
rejected request leaves no trace in any queue, bucket or counter):
  1-3. shared.validation.check: shape (exactly one of prompt / messages, or block_hashes +
     prompt_len), n = 1, request id well-formed, model served (404), sampling values in range
     (temperature ∈ [0, 2], top_p ∈ (0, 1], 1 ≤ max_tokens ≤ max_model_len);
  4. tenant (tenants.py: an API key maps to its tenant; 401 for an unknown key when keys
     are configured; then a caller without a key is anonymous, whatever tenant it claims) and class: tenant pin, else `x-request-tier`, else the declared
     `priority` (vLLM's field, clamped to P0…P3), else the tenant's default, never above
     the tenant's ceiling (a tenant cannot lift itself to P0);
  5. SLO feasibility (feasibility.py): the predicted wait for the class against the TTFT
     deadline → 503 overloaded, Retry-After, queue depth. Before any tokenizing, so the
     refusals an overload produces in bulk cost microseconds;
  6. token buckets, first on a lower bound of the price (max_tokens + 1) so a client over
     its rate is also refused before tokenizing: 429 (tenant's bucket) or 503 (global);
  7. shared.validation.tokenize: tokens, block-hash chain; prompt tokens in the vocabulary;
     prompt + max_tokens ≤ max_model_len (400 context_length_exceeded); the request's TTFT
     deadline (shared.slo.ttft_deadline_s: class target + its own predicted prefill, or the
     client's ttft_slo_ms) is stamped on it, never past the class's cap (shared.slo.deadline_cap_s);
     a prompt whose own prefill on the fastest worker the fleet has shown lately
     (FleetView.best_prefill_s), + CLASS_MARGIN_S, does not fit that cap is a 400 slo_infeasible
     ("never on this fleet": metrics reason beyond_class_cap) naming the highest class it fits
     (none for a pinned tenant) and the least ttft_slo_ms admitted; one that fits only on a
     known faster worker not up now is a 503 with Retry-After; a prompt whose own prefill no worker's running
     decodes can absorb within their TPOT SLO is a 503 (feasibility.py, decode capacity; P3
     waits instead); with an explicit ttft_slo_ms, the prompt's own
     prefill on the fastest worker shown must fit it (400 slo_infeasible; on the fresh ones: 503)
     and so must the wait plus that prefill (503 overloaded);
  8. token buckets on the exact price prompt + max_tokens; both are charged together only
     now, when the request is admitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenyard.services.admission.feasibility import FleetView
from tokenyard.services.admission.tenants import TenantPolicy, TenantTable
from tokenyard.services.admission.token_bucket import TokenBucket
from tokenyard.shared import config, schemas, validation
from tokenyard.shared.schemas import GenerateRequest, Heartbeat, PriorityClass, QueueStats, Rejected
from tokenyard.shared.slo import (
    ENGINE_BACKLOG_S,
    deadline_cap_s,
    fits_class,
    min_ttft_slo_ms,
    ttft_deadline_s,
    ttft_target_s,
)
from tokenyard.shared.tokenizer import Tokenizer

TIER_HEADER = "x-request-tier"
TENANT_HEADER = "x-tenant"
BUCKET_SWEEP_S = 10.0
"""How often `on_tick` forgets the tenant buckets that have refilled. A full bucket is the same
as the fresh one `_tenant_bucket` makes (full, and charged alike), so dropping it changes no
verdict; keeping it costs one bucket per tenant name ever charged: in an open fleet (no API
keys) whose default policy has a rate, one per name a client claims (x-tenant, `user`), forever.
A sweep is O(buckets) and the buckets it leaves are the tenants still refilling."""
API_KEY_HEADER = "x-api-key"


def duration(seconds: float) -> str:
    """A refusal's time as a person reads it: ms under a second (a 512-token prefill of 0.03 s
    printed as "about 0.0 s"), seconds above."""
    return f"{seconds * 1000:.0f} ms" if abs(seconds) < 1.0 else f"{seconds:.1f} s"


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
        self.limits = validation.Limits(
            models=tuple(cfg.models), max_model_len=cfg.max_model_len, block_size=cfg.block_size,
            default_max_tokens=cfg.default_max_tokens, default_chat_max_tokens=cfg.default_chat_max_tokens,
        )
        self.fleet = FleetView()
        t = self.table
        self.global_bucket = (
            TokenBucket(t.global_rate_tokens_per_s, t.global_burst_tokens or 2 * t.global_rate_tokens_per_s)
            if t.global_rate_tokens_per_s else None
        )
        self.buckets: dict[str, TokenBucket] = {}
        """Per-tenant buckets, created on a tenant's first admitted request, forgotten once full
        again (`on_tick`, every BUCKET_SWEEP_S)."""
        self._sweep_at = float("-inf")

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.fleet.on_heartbeat(hb, now)

    def ticks_every(self, tick_s: float) -> None:
        """The shell promises an `on_tick` at least every `tick_s` from now on: a longer gap
        between two of admission's events is its own blind time (liveness.py), which does not
        count against the workers' silence."""
        self.fleet.live.tick_s = tick_s

    def on_tick(self, now: float, observing: bool = True) -> None:
        """Admission is awake at `now`: the shell calls it every tick and before each request
        (a refusal changes no state, so `admit` does not note the time itself). `observing`
        False: its shell is cut off from the bus, and the time is its own blind time. Every
        BUCKET_SWEEP_S it forgets the tenants' buckets that are full again."""
        self.fleet.awake(now, observing)
        if now >= self._sweep_at:
            self.buckets = {t: b for t, b in self.buckets.items() if b.level(now) < b.burst}
            self._sweep_at = now + BUCKET_SWEEP_S

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now` (feasibility.FleetView.on_keepalive)."""
        return self.fleet.on_keepalive(worker_id, now)

    def on_queue_stats(self, stats: QueueStats, now: float) -> None:
        self.fleet.on_queue_stats(stats, now)

    def on_reconnected(self, back_s: float, excuse_s: float) -> None:
        """Its shell's connection came back from an outage at `back_s`, and the workers' take up
        to `excuse_s` (natsutil.RECONNECT_BOUND_S): called before anything heard since is handled
        (feasibility.FleetView.on_reconnected)."""
        self.fleet.on_reconnected(back_s, excuse_s)

    def fleet_health(self, now: float, observing: bool = True) -> schemas.FleetHealth:
        """What it sees of the workers, for an HTTP front's readiness: those `up` by the rule
        every request is judged by (none up: a request gets 503 "No worker is up", or waits for
        the first one), and of those, the ones up as still reconnecting. Changes nothing: a probe
        is not an event that watches the bus."""
        return schemas.FleetHealth(workers_up=len(self.fleet.up_at(now)), workers_known=len(self.fleet.workers),
                                   observing=observing, workers_reconnecting=self.fleet.reconnecting(now)[0])

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

        if not reply_to:
            return bad("a reply subject is required: the request's stream goes there", "reply_to")
        checked = validation.check(req, self.limits)
        if isinstance(checked, validation.Invalid):
            return checked.rejected(rid)
        model, kind, max_tokens = checked.model, checked.kind, checked.max_tokens

        claimed = headers.get(TENANT_HEADER) or req.tenant or req.user or ""
        tenant = self.table.tenant_of(headers.get(API_KEY_HEADER), claimed)
        if tenant is None:
            return bad("Incorrect API key provided", None, "invalid_api_key", 401)
        policy = self.table.policy(tenant)
        priority = self._priority_class(req, headers, policy)
        if isinstance(priority, str):
            return bad(priority, TIER_HEADER)

        # The wait the request may face before its prefill: its class target (its own prefill is
        # added to its deadline), or the client's ttft_slo_ms less a prefill not yet known (≥ 0).
        wait_budget_s = ttft_deadline_s(0.0, int(priority), req.ttft_slo_ms)
        if self.cfg.slo_check and req.ttft_slo_ms is not None and req.ttft_slo_ms / 1000.0 <= ENGINE_BACKLOG_S:
            # No fleet state can make it: a bad request (400), not an overload (503).
            return bad(f"ttft_slo_ms {req.ttft_slo_ms:g} is below what any engine can answer in "
                       f"({ENGINE_BACKLOG_S * 1000:g} ms of engine backlog at least)", "ttft_slo_ms", "slo_infeasible")
        verdict = None
        if self.cfg.slo_check:
            verdict = self.fleet.judge(int(priority), wait_budget_s, now)
            if verdict is not None and not verdict.feasible:
                return self._overloaded(rid, priority, verdict.wait_s, verdict.deadline_s,
                                        verdict.retry_after_s, verdict.depth, now)

        floor = (max_tokens or 0) + 1  # the least this request can cost
        refusal = self._rate_check(rid, tenant, policy, floor, now)
        if refusal is not None:
            return refusal

        prepared = validation.tokenize(req, checked, self.tokenizer, self.limits)
        if isinstance(prepared, validation.Invalid):
            return prepared.rejected(rid)
        tokens, prompt_len, chain, max_tokens = (prepared.tokens, prepared.prompt_len, prepared.chain,
                                                  prepared.max_tokens)
        own = self.fleet.own_prefill_s(prompt_len, now) or 0.0
        best = self.fleet.best_prefill_s(prompt_len, now) or own  # the fastest shown: ≤ own where both known
        deadline = ttft_deadline_s(now, int(priority), req.ttft_slo_ms, own)
        if self.cfg.slo_check and req.ttft_slo_ms is None:
            if not fits_class(best, priority):
                return self._beyond_class(rid, priority, policy, prompt_len, best, checked.prompt_param)
            if not fits_class(own, priority):
                return self._faster_not_up(rid, prompt_len, own, best, deadline_cap_s(priority), now)
        if self.cfg.slo_check and deadline != float("inf"):
            room = self.fleet.decode_room_s(now)
            if room is not None and own > room:
                return self._no_decode_room(rid, priority, prompt_len, own, room, now)
        if self.cfg.slo_check and req.ttft_slo_ms is not None:
            slo = req.ttft_slo_ms / 1000.0
            if best + ENGINE_BACKLOG_S > slo:
                none = (f", or send none to be held to P{int(priority)}'s deadline"
                        if fits_class(best, priority) else "")
                return bad(
                    f"The {prompt_len}-token prompt takes about {best:.1f} s to prefill, beyond the "
                    f"{slo:g} s ttft_slo_ms asked for; send ttft_slo_ms of at least {min_ttft_slo_ms(best)}{none}",
                    checked.prompt_param, "slo_infeasible",
                )
            if own + ENGINE_BACKLOG_S > slo:
                return self._faster_not_up(rid, prompt_len, own, best, slo, now)
            if verdict is not None and verdict.wait_s > 0 and verdict.wait_s + ENGINE_BACKLOG_S + own > slo:
                return self._overloaded(rid, priority, verdict.wait_s, slo,
                                        verdict.wait_s + ENGINE_BACKLOG_S + own - slo, verdict.depth, now)
        price = prompt_len + max_tokens
        refusal = self._rate_check(rid, tenant, policy, price, now)
        if refusal is not None:
            return refusal
        self._charge(tenant, policy, price, now)
        self.fleet.on_admitted(int(priority), price, prompt_len, now, chain, self.cfg.block_size)

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
            sampling=validation.sampling(req),
            kind=kind,
            deadline_s=deadline if deadline != float("inf") else 0.0,
            tpot_slo_ms=req.tpot_slo_ms or 0.0,
            prefill_s=own,
        )

    # ── refusals: computed from state, changing none ──
    def _overloaded(self, rid: str, priority: PriorityClass, wait: float, deadline: float,
                    retry_after: float, depth: int, now: float) -> Rejected:
        if wait == float("inf") and self.fleet.fleet_down(now):
            heard = ("none has been heard from" if not self.fleet.workers else
                     "none has been heard from lately, or every one is draining or unhealthy")
            return Rejected(
                request_id=rid, status=503, code="no_workers",
                message=f"No worker is up ({heard}): a P{int(priority)} request cannot be served; "
                        f"start a worker (tokenyard worker) or retry later",
                retry_after_s=self.fleet.stale_after_s, queue_depth=depth,
            )
        reconnecting, due = self.fleet.reconnecting(now)
        if wait != float("inf") and due > 0 and wait == due:  # the wait is theirs, not a backlog's
            return Rejected(
                request_id=rid, status=503, code="overloaded", reason="workers_reconnecting",
                message=f"No worker has been heard from since admission's return to the bus: the {reconnecting} up may "
                        f"take {duration(due)} more to reconnect, beyond a P{int(priority)} request's {deadline:g} s "
                        f"TTFT target; retry later",
                retry_after_s=retry_after, queue_depth=depth,
            )
        wait_text = "no capacity to serve it" if wait == float("inf") else f"a predicted wait of {wait:.2f} s"
        return Rejected(
            request_id=rid, status=503, code="overloaded",
            message=f"Fleet saturated: a P{int(priority)} request faces {wait_text} against its "
                    f"{deadline:g} s TTFT target ({depth} requests queued); retry later",
            retry_after_s=retry_after if retry_after != float("inf") else self.fleet.stale_after_s,
            queue_depth=depth,
        )

    @staticmethod
    def _beyond_class(rid: str, priority: PriorityClass, policy: TenantPolicy, prompt_len: int, own: float,
                      param: str | None) -> Rejected:
        """The prompt's own prefill on the fastest worker this fleet has shown leaves no room within
        its class's deadline cap even on an idle fleet (shared.slo.fits_class): a 400, since no
        retry of the same request can pass. It names the highest class the prompt fits (P3 always
        does), unless the tenant is pinned to its class, and the least ttft_slo_ms admitted."""
        c = int(priority)
        lower = next(k for k in range(c + 1, 4) if fits_class(own, k))
        tier = "" if policy.pinned_class is not None else f"at a lower class ({TIER_HEADER}: P{lower}) or "
        return Rejected(
            request_id=rid, status=400, code="slo_infeasible", param=param, reason="beyond_class_cap",
            message=f"The {prompt_len}-token prompt takes about {own:.1f} s to prefill, beyond what a P{c} request "
                    f"may take before its first token ({deadline_cap_s(c):.3g} s at most, from its "
                    f"{ttft_target_s(c):g} s TTFT target); send it {tier}with ttft_slo_ms of at least "
                    f"{min_ttft_slo_ms(own)}",
        )

    def _faster_not_up(self, rid: str, prompt_len: int, own: float, best: float, bound: float,
                       now: float) -> Rejected:
        """The prompt fits its bound on the fastest worker this fleet has shown, not on the ones up
        now (that one is stale, draining or restarting): a 503 with Retry-After, not a 400."""
        return Rejected(
            request_id=rid, status=503, code="overloaded",
            message=f"The {prompt_len}-token prompt takes about {duration(own)} to prefill on the workers up now, "
                    f"beyond its {bound:.3g} s; a faster worker of this fleet ({duration(best)}) is not up; retry later",
            retry_after_s=self.fleet.stale_after_s, queue_depth=self.fleet.depth(now),
        )

    def _no_decode_room(self, rid: str, priority: PriorityClass, prompt_len: int, own: float,
                        room: float, now: float) -> Rejected:
        return Rejected(
            request_id=rid, status=503, code="overloaded",
            message=f"Fleet saturated: the {prompt_len}-token prompt's prefill (about {duration(own)}) would push "
                    f"the running decodes past their TPOT SLO on every worker (the most any can absorb now: "
                    f"{duration(max(room, 0.0))}); retry later",
            retry_after_s=own - max(room, 0.0), queue_depth=self.fleet.depth(now),
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
