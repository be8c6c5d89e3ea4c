"""Tenants: who a request belongs to, what class it may reach, how fast it may spend.

    tenant = api_keys[x-api-key]                 a key names its tenant; no header overrides it
             401 for an unknown key                  (when any key is configured)
             "" when keys are configured and the     an unauthenticated caller is anonymous: the
                caller gave none                     tenant it claims (x-tenant, `tenant`, `user`)
                                                     is ignored, so nobody borrows another's class
             else the claim: x-tenant header, the    an open fleet (no keys configured) trusts
                request's `tenant`, its `user`, ""   its callers' names
    class  = policy.pinned_class                  tenant policy first (DESIGN §3.2), else
             x-request-tier header, else the declared `priority` (vLLM's, 0 = undeclared),
             else policy.default_class;  capped: max(class, policy.ceiling)
A tenant without a policy of its own gets `default` (ceiling P1: nobody reaches P0 unless
granted it). Loaded from TOML by `load_tenants`:

    [global]              rate = 200000   burst = 400000          # tokens/s, tokens
    [default]             ceiling = "P1"  rate = 20000  burst = 40000
    [tenants.vip]         ceiling = "P0"  api_keys = ["sk-vip"]
    [tenants.batch]       pin = "P2"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenyard.shared.schemas import PriorityClass


@dataclass(frozen=True)
class TenantPolicy:
    ceiling: PriorityClass = PriorityClass.P1
    default_class: PriorityClass = PriorityClass.P1
    pinned_class: PriorityClass | None = None
    rate_tokens_per_s: float | None = None
    """None: no per-tenant limit."""
    burst_tokens: float | None = None


@dataclass
class TenantTable:
    tenants: dict[str, TenantPolicy] = field(default_factory=dict)
    default: TenantPolicy = field(default_factory=TenantPolicy)
    api_keys: dict[str, str] = field(default_factory=dict)
    """API key → tenant."""
    global_rate_tokens_per_s: float | None = None
    global_burst_tokens: float | None = None

    def tenant_of(self, api_key: str | None, claimed: str) -> str | None:
        """The tenant a request belongs to (see the module header); None: an unknown key."""
        if not self.api_keys:
            return claimed
        if api_key is None:
            return ""
        return self.api_keys.get(api_key)

    def policy(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant, self.default)


def _class(value: Any, what: str) -> PriorityClass:
    text = str(value).strip().upper().removeprefix("P")
    if text not in ("0", "1", "2", "3"):
        raise ValueError(f"{what} must be one of P0..P3, got {value!r}")
    return PriorityClass(int(text))


def _policy(d: dict[str, Any], base: TenantPolicy, where: str) -> TenantPolicy:
    unknown = set(d) - {"ceiling", "default_class", "pin", "rate", "burst", "api_keys"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    rate = d.get("rate", base.rate_tokens_per_s)
    burst = d.get("burst", base.burst_tokens if "rate" not in d else None)
    if rate is not None and burst is None:
        burst = 2.0 * float(rate)
    return TenantPolicy(
        ceiling=_class(d["ceiling"], f"{where}.ceiling") if "ceiling" in d else base.ceiling,
        default_class=_class(d["default_class"], f"{where}.default_class") if "default_class" in d
        else base.default_class,
        pinned_class=_class(d["pin"], f"{where}.pin") if "pin" in d else None,
        rate_tokens_per_s=None if rate is None else float(rate),
        burst_tokens=None if burst is None else float(burst),
    )


def load_tenants(doc: dict[str, Any]) -> TenantTable:
    """A TenantTable from a parsed TOML document (see the module header)."""
    g = doc.get("global", {})
    default = _policy(doc.get("default", {}), TenantPolicy(), "default")
    table = TenantTable(default=default, global_rate_tokens_per_s=g.get("rate"), global_burst_tokens=g.get("burst"))
    if table.global_rate_tokens_per_s is not None and table.global_burst_tokens is None:
        table.global_burst_tokens = 2.0 * table.global_rate_tokens_per_s
    for name, d in doc.get("tenants", {}).items():
        table.tenants[name] = _policy(d, default, f"tenants.{name}")
        for key in d.get("api_keys", []):
            if key in table.api_keys:
                raise ValueError(f"API key of tenants.{name} is already given to {table.api_keys[key]!r}")
            table.api_keys[key] = name
    return table
