"""EcoServe's per-worker rules (seed 002, docs/ARCHITECTURE.md §7): pure functions the macro-instance
controller, the router's EcoServe filter and the cluster simulator all call, so none of them
keeps a private copy of the policy.

Inputs per worker, from its heartbeat:
  P  pending prefill tokens (accepted, not yet computed)      c  prefill cost, ms per token
  S  saved TPOT slack of its running decodes, ms (None: no decodes) — for a decoding request
     that has produced g tokens since its first, t ms ago, with k more to come after its next
     one (k = max_tokens − 2 − g) at the worker's decode step time d:
         (g + 1 + k)·TPOT_SLO − t − k·d
     how long its next token may still be delayed with its mean TPOT — what the SLO scores —
     kept within the SLO: the time its decodes run ahead of the SLO, already and still to come
     (a request that has just produced its first token is not at 0; the seed's prefill phase
     spends what its decode phase saves). S is the minimum over its decodes (a prefill delays
     every decode of the worker, so the tightest counts)
  F  free KV blocks                                           u  compute utilisation (0…1)

Estimated prefill time of n more tokens:    T(n) = c · (P + n)
Constraint check of request r (n new tokens, prompt L, max_tokens M) on a worker:
  1. TTFT    T(n) ≤ TTFT_SLO
  2. TPOT    S is None  or  S ≥ T(n)           (the decodes' saved slack absorbs the prefill)
  3. memory  ⌈(L + M) / block⌉ ≤ F             (its whole KV fits: no preemption later)
Placement (seed §3.1.2): the session's last worker if it passes; else the first worker that
passes after the round-robin cursor; else the least loaded (running + waiting, then id).
Phase switches:
  prefill → decode   backlog ≤ 2 requests  or  u ≥ 0.9 (compute saturated)
  decode → prefill   S is None  or  S ≥ 1.5 × estimated prefill time of the phase ahead
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenyard.shared.schemas import Heartbeat, Phase


class Refusal(enum.IntEnum):
    """Why the constraint check refuses a worker; 0 = it passes. Doubles as a metric label."""

    OK = 0
    TTFT = 1
    TPOT = 2
    MEMORY = 3


MIN_PHASE_S = 1.0
"""A worker holds a phase at least this long (no flapping between two heartbeats): the macro
controller's default (RollingConfig.min_phase_s)."""


@dataclass(frozen=True)
class EcoConfig:
    ttft_slo_ms: float = 2000.0
    tpot_slo_ms: float = 100.0
    backlog_switch: int = 2
    """prefill → decode once at most this many requests wait for their prefill."""
    saturation: float = 0.9
    """prefill → decode once compute utilisation reaches this (the seed's 90%)."""
    slack_factor: float = 1.5
    """decode → prefill once the saved slack covers this multiple of the prefill estimate."""


@dataclass(frozen=True)
class WorkerLoad:
    """One worker as the rules see it (a heartbeat's fields)."""

    worker_id: str
    pending_tokens: int = 0
    ms_per_token: float = 0.0
    slack_ms: float | None = None
    kv_free: int = 1 << 30
    block_size: int = 16
    running: int = 0
    waiting: int = 0
    compute_util: float = 0.0

    def prefill_ms(self, new_tokens: int = 0) -> float:
        return self.ms_per_token * (self.pending_tokens + new_tokens)


def load_of(hb: Heartbeat) -> WorkerLoad:
    s = hb.stats
    return WorkerLoad(
        hb.worker_id, s.queued_prefill_tokens, s.prefill_ms_per_token, s.tpot_slack_ms,
        s.kv_blocks_free, s.block_size, s.running, s.waiting, s.compute_util,
    )


def refusals(
    pending_tokens: np.ndarray,
    ms_per_token: np.ndarray,
    slack_ms: np.ndarray,
    kv_free: np.ndarray,
    block_size: np.ndarray,
    new_tokens: int | np.ndarray,
    prompt_len: int,
    max_tokens: int,
    cfg: EcoConfig,
) -> np.ndarray:
    """The constraint check over many workers at once: a Refusal code per worker (the first
    constraint that fails, in the order TTFT, TPOT, memory). `slack_ms` is NaN where a worker
    has no running decode. `new_tokens` may differ per worker (prefix-cache hits)."""
    t = ms_per_token * (pending_tokens + new_tokens)
    need = -(-(prompt_len + max_tokens) // block_size)
    out = np.zeros(len(t), dtype=np.int8)
    out[need > kv_free] = Refusal.MEMORY
    out[~np.isnan(slack_ms) & (slack_ms < t)] = Refusal.TPOT
    out[t > cfg.ttft_slo_ms] = Refusal.TTFT
    return out


def check(w: WorkerLoad, new_tokens: int, prompt_len: int, max_tokens: int, cfg: EcoConfig) -> Refusal:
    """The constraint check of one worker (the vectorised one on a single row)."""
    slack = np.nan if w.slack_ms is None else w.slack_ms
    r = refusals(
        np.array([w.pending_tokens]), np.array([w.ms_per_token]), np.array([slack], dtype=np.float64),
        np.array([w.kv_free]), np.array([w.block_size]), new_tokens, prompt_len, max_tokens, cfg,
    )
    return Refusal(int(r[0]))


@dataclass(frozen=True)
class Placement:
    worker_id: str | None
    how: str
    """`session`, `round_robin`, `least_loaded` or `none` (no worker at all)."""
    cursor: int
    """The round-robin cursor to pass to the next call."""


def place(
    workers: Sequence[WorkerLoad],
    new_tokens: int,
    prompt_len: int,
    max_tokens: int,
    cfg: EcoConfig,
    cursor: int = 0,
    last_worker: str | None = None,
) -> Placement:
    """Seed §3.1.2 among `workers` (those in their prefill phase, in a fixed order):
    the session's last worker if it passes the check; else the first passing worker at or
    after `cursor` (cyclically), the cursor then moving past it; else the least loaded."""
    if not workers:
        return Placement(None, "none", cursor)
    ok = [check(w, new_tokens, prompt_len, max_tokens, cfg) == Refusal.OK for w in workers]
    if last_worker is not None:
        for w, passed in zip(workers, ok, strict=True):
            if w.worker_id == last_worker and passed:
                return Placement(w.worker_id, "session", cursor)
    n = len(workers)
    for k in range(n):
        i = (cursor + k) % n
        if ok[i]:
            return Placement(workers[i].worker_id, "round_robin", (i + 1) % n)
    best = min(workers, key=lambda w: (w.running + w.waiting, w.worker_id))
    return Placement(best.worker_id, "least_loaded", cursor)


def leaves_prefill(backlog_requests: int, compute_util: float, cfg: EcoConfig) -> bool:
    """prefill → decode: the backlog is small, or compute is saturated."""
    return backlog_requests <= cfg.backlog_switch or compute_util >= cfg.saturation


def prefill_phase_starved(phase: str, mode: str, waiting: int, backlog_s: float,
                          cfg: EcoConfig = EcoConfig()) -> bool:
    """Is an EcoServe worker in its prefill phase starved of work: no more than `backlog_switch`
    requests waiting (with which leaves_prefill ends the phase) and less than MIN_PHASE_S of
    prefill (`backlog_s`) to run? Flow control then lets it take one more request whatever its
    prefill-time bound (shared.slo.prefill_budget_s): that bound, a quarter second of prefill, is
    under one full 2,048-token chunk on a slow engine (0.9 s on l20-codellama34b-tp4), so with
    the backlog held in the queue such a worker never saw more than 2 waiting, each phase ended
    at its minimum length, and requests waited in the queue instead (Azure conversation ×4:
    goodput 3.35 req/s; 9.60 with this rule). The MIN_PHASE_S bound keeps a worker holding long
    prompts from taking more (coder ×0.3: 3.00 req/s with the count alone, 4.66 with both).
    What it takes is still subject to the router's constraint check (TTFT SLO, TPOT slack).
    Spatial P/D's prefill workers (mode `pd`) have no phase to end."""
    return (mode == "ecoserve" and phase == Phase.PREFILL and waiting <= cfg.backlog_switch
            and backlog_s < MIN_PHASE_S)


def ready_for_prefill(slack_ms: float | None, est_prefill_ms: float, cfg: EcoConfig) -> bool:
    """decode → prefill: the decodes' saved slack covers 1.5 × the prefill ahead."""
    return slack_ms is None or slack_ms >= cfg.slack_factor * est_prefill_ms


def saved_slack_ms(
    tokens_since_first: int, ms_since_first: float, tpot_slo_ms: float, still_to_come: int = 0, decode_ms: float = 0.0
) -> float:
    """One decoding request's saved TPOT slack: how long its next token may still be delayed,
    its mean TPOT then within the SLO — (g + 1 + k)·TPOT_SLO − t − k·d with k tokens still to
    come after the next at d ms each. Counting only the tokens already made (g·TPOT_SLO − t)
    gives a decode that has just produced its first token a slack ≤ 0, so every worker holding
    a fresh decode refused every prefill (issue 13, fix 3); k = 0 is the slack of its next
    token alone."""
    k = max(still_to_come, 0)
    return (tokens_since_first + 1 + k) * tpot_slo_ms - ms_since_first - k * decode_ms
