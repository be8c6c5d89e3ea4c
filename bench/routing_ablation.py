"""How the default policy (marginal latency, services/router/policies/latency.py) was chosen:
its terms switched on and off, on the tuning workloads only (the first 3,000 requests of the
Mooncake conversation trace; ChatBot), 16 × a100-llama3-8b, in the cluster simulator.

    python -m bench.routing_ablation [--traces DIR] [--loads 1,2,3] [--only own,h0,default,bl]
                                     [--workloads mooncake-tune,chatbot] [--requests N]

Workloads: mooncake-tune (requests 0–2,999 of the Mooncake conversation trace), its three
1,000-request windows mooncake-tune-a/-b/-c (0–999, 1,000–1,999, 2,000–2,999: the reported
points' size), chatbot; the reported ones only to show a change afterwards.

Variants (Q queued prefill tokens, N uncached tokens of r, B running + waiting, B̄ the
candidates' mean of B, all on instance i; lower cost wins):
    own        Q + N                             least work left, cache-aware
    h0         Q + N · (1 + B̄)                   the stall at the fleet's batch only
    h1         Q + N · (1 + B_i)                 the stall at i's batch only
    default    Q + N · (1 + (B_i + B̄) / 2)       the router's default
    kv         default + (B_i + 1) · max(0, Q + N + max_tokens − free KV tokens_i)
    decode     default + max_tokens · (κ · (C_i + len(r) · B_i) + β · B_i),
               C_i = KV blocks used × block size + Q, κ = 1e-3, β = 0.33 (a decode step's cost
               per context token and per sequence in prefill-token times, a100-llama3-8b)
    bl         default behind the bounded-load guard L_i + 1 ≤ ⌈c·(ΣL + 1)/n⌉, L = running +
               waiting, c = 1.25 — last round's default
    bl15       bl with c = 1.5;  h1-bl, own-bl: h1, own behind the same bound
    bls        default behind step_ms_i ≤ 1.25 × the candidates' mean (measured step time)
    blkv       default behind KV blocks in use ≤ max(1.25 × mean, min);  bl-kv: both bounds
    step       default + step × max_tokens × step_ms_i / prefill_ms_per_token_i (r's own
    step01     decode time from the heartbeat's step time, weight 1 and 0.1)
    bl-kvp     bl + u_i · len(r) · (1 + (B_i + B̄)/2), u_i = KV blocks in use / KV blocks: r's
               prompt recomputed (preempted) with probability u_i;  bl-kvrel: u_i − ū, ≥ 0
    bl-sticky  bl, and the bound exempts an instance where r's own TTFT Q + N is no later than
               anywhere within the bound;  bl-stickyq: and only where hit_i > Q_i;
    bl-stickyqw  bl-stickyq and only where nothing waits (W_i = 0)
  round 5 (on slackhalf-bl-stickyq, round 4's default):
    -tb, -tr, -tkv, -tbkv   ties → own TTFT, then fewer sequences (B_i) / running sequences /
                          KV blocks in use / B_i then KV blocks, before recency
    slackhalf-bl-stickyqi   the exemption withheld while an instance within the bound is idle
    slackhalf-bl-stickyqn   … while an instance within the bound was never chosen (cold)
  round 6 (r's decode priced from the heartbeat: over O = max_tokens steps r gets
  O·(B_i + ρ_i·C_i) and inflicts O·B_i·(1 + ρ_i·len(r)) prefill-token times, ρ_i =
  decode_ms_per_ctx_token / prefill_ms_per_token, C_i = KV in use in tokens; decode_cost):
    slackhalf-bl-stickyq-dec, -decg   + r's decode in the cost (gets + inflicts / gets only)
    slackhalf-bl-stickyqd, qdf        the exemption compares r's TTFT + what r gets (+ inflicts)
    slackhalf-bl-stickyqdb            … + O·B_i alone (no context term)
    slackhalf-bl-stickyqdm            … + what r gets + the fleet's half of its recompute, N_i·B̄/2
    slackhalf-bl-stickyqdc            qdm with r's decode priced on i's context alone, O·ρ_i·C_i
                                      (the per-sequence t_i of the convention left out)
    slackhalf-bl-stickyqd-dec         qdf and -dec
  round 8:
    slackhalf-bl-stickyqm             the exemption compares r's TTFT + the fleet's half of its
                                      recompute, Q_i + N_i·(1 + B̄/2) (qdm without r's decode)
    slackhalfcap-bl-stickyq           the fleet's half whole, i's beyond the slack capped at
                                      ENGINE_BACKLOG_S;  slackhalfcap-bl-stickyqdm: and qdm
    slackhalfq-bl-stickyq             the slack absorbs only where a queue is (Q_i > 0)
  round 9 (on slackhalf-bl-stickyq; the TPOT p99 and goodput cells, docs/results-routing.md):
    slackidle-bl-stickyq      the slack absorbs only while no candidate is idle (B = 0, Q = 0):
                              with one, i's own half of the stall is priced whole (round 3's)
    slackexcess-bl-stickyq    absorbed tokens still stall i's sequences beyond the mean,
                              min(N, A)·max(0, B_i − B̄)/2;  slackidleexcess-: both
    slackhalf-bl-stickyqs     the exemption compares Q + N + N·B/2 (i's own half of the stall,
                              unabsorbed) on both sides;  qsw: N·B whole;  qsi: the exempt side only
    slackhalf-bl-stickyq-trq0 ties → own TTFT, then fewer running sequences among the candidates
                              with nothing queued (Q = 0), before recency
  --reported OUT runs each variant on the reported cells (1,000 requests, the sweep's loads)
  as the default's entry beside the committed peers (docs/results/routing), one folder per
  variant under OUT, for `python -m bench.routing_sweep --out OUT/VARIANT --versus
  docs/results/routing`.
  round 4 (A_i = max(0, S_i / t_i − Q_i): prefill tokens i's decodes absorb within their TPOT
  slack S_i, t_i = prefill ms per token; ∞ where nothing decodes):
    slack-bl-stickyq      bl-stickyq, the stall N·(B_i + B̄)/2 only for max(0, N − A_i) tokens
    slackcap-bl-stickyq   the same with S_i capped at ENGINE_BACKLOG_S (the queue's budget)
    slackhalf-bl-stickyq  Q + N + (N·B̄ + max(0, N − A_i)·B_i)/2 behind bl-stickyq's guard —
                          the router's default since round 4 (`marginal-latency`)
    own-bl-stickyq        Q + N behind bl-stickyq's guard
    room, own-room, bl-room, bl-stickyq-room   only candidates where Q + N fits the flow
                          control's room min(S_i capped at ENGINE_BACKLOG_S / t_i, free KV)
                          (none fits: the room says nothing)
    kv-stickyq, bl-kv-stickyq, tok-stickyq, bl-tok-stickyq   the bound on KV blocks in use, or
                          on tokens T_i = KV in use + Q (T_i + N ≤ 1.25 × the mean), with the
                          exemption
  --only also takes a router policy by name (a peer, or `marginal-latency` itself), run as is.
These are measurements of the default's design, not policies: none of them is offered by the
router (only `slackhalf-bl-stickyq-trq0` is, as `marginal-latency` since round 12;
`slackhalf-bl-stickyq` was rounds 4–11's default, `bl-stickyq` round 3's
default, `bl` round 2's, `default` the one before). The reported
workloads (mooncake-report, api) are here only to show what the change did there after it
was chosen; the choice used mooncake-tune and chatbot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenyard.data import TRACES
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.router import core
from tokenyard.services.router.pipeline import Narrowed, Scored
from tokenyard.shared.slo import ENGINE_BACKLOG_S
from tokenyard.simulator.cluster import SimConfig
from tokenyard.simulator.run import simulate

from bench import routing_sweep as rs

KAPPA, BETA = 1e-3, 0.33


@dataclass
class Variant:
    name: str
    stall: str = "mid"  # none | fleet | instance | mid
    kv: bool = False
    decode: bool = False
    bound: str = ""  # "": none | seq: B_i + 1 ≤ ⌈c·(ΣB + 1)/n⌉ | step: step_ms_i ≤ c · mean
    #                  | kv: KV blocks in use ≤ c · mean | seq+kv: both
    c: float = 1.25
    step: float = 0.0  # weight of r's own decode time, O · step_ms_i / ms_per_token_i
    kvp: str = ""  # "": none | "own": r's prompt recomputed with probability u_i (KV in use / KV)
    #               | "rel": the same with max(0, u_i − ū), relative to the candidates' mean
    sticky: str = ""  # the bound exempts an instance where r's own TTFT (Q + N) is lowest ("own"),
    #                   and, with "q", only where r's cached tokens there exceed i's queued prefill;
    #                   "qw": "q" and only where no request waits (r is admitted at once)
    slack: str = ""  # "": r's prefill stalls i's decodes whole | "raw": only beyond their TPOT slack
    #                  (tokens: slack_ms / ms_per_token, less Q) | "cap": that slack capped at ENGINE_BACKLOG_S
    tie: str = ""  # "": ties → lower Q + N, then least recently chosen | "b": then fewer sequences (B_i)
    #              | "r": then fewer running (decoding) sequences, the heartbeat's alone
    #              | "kv": then fewer KV blocks in use (i's decode context) | "bkv": B_i, then KV in use
    dec: str = ""  # "": no decode term | "full": + r's decode priced (the TPOT it gets and inflicts,
    #              decode_cost below) | "gets": + only the TPOT r gets
    inputs: frozenset[str] = frozenset()

    def score(self, req, view, cand) -> Scored:
        q = view.queued_prefill[cand]
        n = view.new[cand].astype(np.float64)
        b = (view.running[cand] + view.waiting[cand]).astype(np.float64)
        batch = {"none": 0.0, "fleet": b.mean(), "instance": b, "mid": (b + b.mean()) / 2.0}[self.stall]
        own = q + n
        if self.slack:  # only the part of r's prefill beyond what i's decodes can absorb stalls them
            slack = view.slack_ms[cand]
            mpt = np.maximum(view.ms_per_token[cand], 1e-9)
            room = np.where(np.isnan(slack), np.inf, slack / mpt)
            if self.slack in ("cap", "halfcap"):
                room = np.minimum(room, ENGINE_BACKLOG_S * 1000.0 / mpt)
            stalled = np.maximum(n - np.maximum(room - q, 0.0), 0.0)
            if self.slack == "halfq":  # the slack absorbs only behind a queue: where nothing is
                stalled = np.where(q > 0, stalled, n)  # queued r's prefill runs at once, a stall
            if self.slack in ("idle", "idleexcess") and ((b == 0) & (q == 0)).any():
                stalled = n  # an idle candidate: r's prefill there stalls no one, so i's stall counts whole
            if self.slack in ("half", "halfcap", "halfq", "idle"):  # the fleet's half of the stall whole, i's half beyond i's slack
                cost = own + n * b.mean() / 2.0 + stalled * b / 2.0
            elif self.slack in ("excess", "idleexcess"):  # absorbed tokens still stall i's sequences beyond the mean
                cost = own + (n * b.mean() + stalled * b + (n - stalled) * np.maximum(b - b.mean(), 0.0)) / 2.0
            else:
                cost = own + batch * stalled
        else:
            cost = own + n * batch
        out = float(max(req.max_tokens, 1))
        if self.kv:
            cost = cost + (b + 1.0) * np.maximum(q + n + out - view.kv_free[cand] * view.block_size[cand], 0.0)
        if self.decode:
            ctx = view.kv_used[cand] * view.block_size[cand] + q
            cost = cost + out * (KAPPA * (ctx + req.prompt_len * b) + BETA * b)
        if self.kvp:
            used = view.kv_used[cand].astype(np.float64)
            total = used + view.kv_free[cand]
            u = np.divide(used, total, out=np.zeros(len(cand)), where=total > 0)
            if self.kvp == "rel":
                u = np.maximum(u - u.mean(), 0.0)
            cost = cost + u * float(req.prompt_len) * (1.0 + batch)
        if self.step:
            mpt = np.maximum(view.ms_per_token[cand], 1e-6)
            cost = cost + self.step * out * view.step_ms[cand] / mpt
        if self.dec:
            cost = cost + decode_cost(req, view, cand, inflicted=self.dec == "full")
        return Scored(cost, tiebreak=tiebreak(self.tie, own, view, cand))


def decode_cost(req, view, cand, inflicted: bool = True, context: bool = True) -> np.ndarray:
    """r's decode on i in prefill-token times (round 6), from i's heartbeat: a decode step costs
    each sequence about t_i + K·d_i ms (t_i prefill ms per token, d_i decode ms per context
    token, K its context: EngineStats.decode_ms_per_ctx_token's convention), so over r's O =
    max_tokens steps r gets O·(B_i·t_i + d_i·C_i) more than on an empty instance (B_i sequences,
    C_i = KV blocks in use × block size their context) and inflicts O·B_i·(t_i + d_i·len(r)) on
    i's sequences; ÷ t_i."""
    t = view.ms_per_token[cand]
    d = np.array([view.stats[j].decode_ms_per_ctx_token for j in cand], dtype=np.float64)
    ratio = np.divide(d, t, out=np.zeros(len(cand)), where=t > 0)
    b = (view.running[cand] + view.waiting[cand]).astype(np.float64)
    ctx = (view.kv_used[cand] * view.block_size[cand]).astype(np.float64)
    out = float(max(req.max_tokens, 1))
    gets = b + ratio * ctx if context else b
    if not inflicted:
        return out * gets
    return out * (gets + b * (1.0 + ratio * float(req.prompt_len)))


def tiebreak(tie: str, own: np.ndarray, view, cand) -> np.ndarray:
    """Lexicographic (own, then the decode load `tie` names): own is in whole tokens, so a
    fraction below 1 orders only the candidates whose own TTFT ties."""
    if not tie:
        return own
    if tie == "rq0":  # fewer running sequences, among the candidates where nothing is queued
        r = view.running[cand].astype(np.float64)
        return np.floor(own) + np.where(view.queued_prefill[cand] == 0, r / (r.max() + 1.0), 0.0)
    b = (view.running[cand] + view.waiting[cand]).astype(np.float64)
    kv = view.kv_used[cand].astype(np.float64)
    running = view.running[cand].astype(np.float64)
    load = {"b": b, "r": running, "kv": kv, "bkv": b + kv / (kv.max() + 1.0)}[tie]
    return np.floor(own) + load / (load.max() + 1.0)


@dataclass
class BoundGuard:
    """Consistent hashing with bounded loads, made relative (Mirrokni et al.): only the
    candidates whose load stays within c × the candidates' mean (seq: sequences in flight,
    counting r; step: the measured step time) may be scored."""

    how: str
    c: float
    sticky: str = ""
    name: str = "bound"
    inputs: frozenset[str] = frozenset()

    def narrow(self, req, view, cand) -> Narrowed:
        keep = np.ones(len(cand), dtype=np.bool_)
        if "seq" in self.how:
            b = (view.running[cand] + view.waiting[cand]).astype(np.float64)
            keep &= b + 1 <= np.ceil(self.c * (b.sum() + 1) / len(cand))
        if "kv" in self.how:
            kv = view.kv_used[cand].astype(np.float64)
            keep &= kv <= max(self.c * kv.mean(), kv.min())
        if "tok" in self.how:  # tokens on i: the context its sequences hold + the prefill queued there
            t = (view.kv_used[cand] * view.block_size[cand] + view.queued_prefill[cand]).astype(np.float64)
            keep &= t + view.new[cand] <= self.c * (t.sum() + view.new[cand].mean()) / len(cand)
        if "step" in self.how:
            s = view.step_ms[cand]
            keep &= s <= self.c * s.mean()
        if "room" in self.how:  # r's prefill fits i's room as the queue's flow control counts it
            fit = keep & fits_room(view, cand)  # (none fits: the room says nothing)
            if fit.any():
                keep = fit
        if self.sticky and keep.any() and not keep.all():
            own = view.queued_prefill[cand] + view.new[cand]
            exempt = own <= own[keep].min()
            if self.sticky in ("q", "qw", "qi", "qn", "qd", "qdf", "qdb", "qdm", "qdc", "qm"):
                exempt &= view.hit[cand] > view.queued_prefill[cand]
            if self.sticky == "qw":  # and nothing waits there: r is admitted at once
                exempt &= view.waiting[cand] == 0
            if self.sticky == "qi":  # and no instance within the bound is idle (L = 0: r waits for
                b = view.running[cand] + view.waiting[cand]  # nothing there and stalls no one)
                if (b[keep] == 0).any():
                    exempt[:] = False
            if self.sticky in ("qd", "qdf", "qdb"):  # r's own latency there: its first token, then
                own = own + decode_cost(req, view, cand, inflicted=self.sticky == "qdf",  # its decode
                                        context=self.sticky != "qdb")
            if self.sticky in ("qdm", "qdc"):  # r's first token and decode, and the fleet's half of
                b = (view.running[cand] + view.waiting[cand]).astype(np.float64)  # the stall its
                own = own + view.new[cand] * b.mean() / 2.0 + (  # recompute inflicts; qdc: r's decode
                    decode_cost(req, view, cand, inflicted=False) if self.sticky == "qdm"  # on i's
                    else decode_cost(req, view, cand, inflicted=False) - float(max(req.max_tokens, 1)) * b)  # context alone
                exempt = (own <= own[keep].min()) & (view.hit[cand] > view.queued_prefill[cand])
                exempt = (own <= own[keep].min()) & (view.hit[cand] > view.queued_prefill[cand])
            if self.sticky == "qm":  # r's first token and the fleet's half of the stall its
                b = (view.running[cand] + view.waiting[cand]).astype(np.float64)  # recompute inflicts
                own = own + view.new[cand] * b.mean() / 2.0
                exempt = (own <= own[keep].min()) & (view.hit[cand] > view.queued_prefill[cand])
            if self.sticky in ("qs", "qsw", "qsi"):  # i's own stall, unabsorbed: N·B/2 (qsw: N·B)
                b = (view.running[cand] + view.waiting[cand]).astype(np.float64)
                mine = own + view.new[cand] * b * (1.0 if self.sticky == "qsw" else 0.5)
                other = own if self.sticky == "qsi" else mine  # qsi: the kept ones at Q + N
                exempt = (mine <= other[keep].min()) & (view.hit[cand] > view.queued_prefill[cand])
            if self.sticky == "qn" and (view.last_chosen[cand][keep] < 0).any():
                exempt[:] = False  # and no instance within the bound was never chosen (a cold one)
            keep |= exempt
        return Narrowed(keep if keep.any() else np.ones(len(cand), dtype=np.bool_))


def fits_room(view, cand) -> np.ndarray:
    """Q_i + N_i within the prefill i may hold (services/priority_queue/core.py's room_w: its
    decodes' TPOT slack, capped at ENGINE_BACKLOG_S, in prefill tokens; and its free KV)."""
    slack = view.slack_ms[cand]
    budget_ms = np.where(np.isnan(slack), ENGINE_BACKLOG_S * 1000.0, np.minimum(slack, ENGINE_BACKLOG_S * 1000.0))
    mpt = view.ms_per_token[cand]
    tokens = np.where(mpt > 0, budget_ms / np.maximum(mpt, 1e-9), np.inf)
    tokens = np.minimum(tokens, view.kv_free[cand] * view.block_size[cand])
    return view.queued_prefill[cand] + view.new[cand] <= tokens


VARIANTS = {v.name: v for v in (  # each by its name
    Variant("own", stall="none"),
    Variant("h0", stall="fleet"),
    Variant("h1", stall="instance"),
    Variant("default"),
    Variant("kv", kv=True),
    Variant("decode", decode=True),
    Variant("bl", bound="seq"),
    Variant("bl15", bound="seq", c=1.5),
    Variant("bls", bound="step"),
    Variant("h1-bl", stall="instance", bound="seq"),
    Variant("own-bl", stall="none", bound="seq"),
    Variant("step", step=1.0),
    Variant("step01", step=0.1),
    Variant("bl-step01", bound="seq", step=0.1),
    Variant("blkv", bound="kv"),
    Variant("bl-kv", bound="seq+kv"),
    Variant("bl-sticky", bound="seq", sticky="own"),
    Variant("bl-kvp", bound="seq", kvp="own"),
    Variant("bl-kvrel", bound="seq", kvp="rel"),
    Variant("bl-sticky-kvp", bound="seq", sticky="own", kvp="own"),
    Variant("kvp", kvp="own"),
    Variant("bl-stickyq", bound="seq", sticky="q"),
    Variant("bl-stickyqw", bound="seq", sticky="qw"),
    Variant("room", bound="room"),
    Variant("slackhalf-bl-stickyq", bound="seq", sticky="q", slack="half"),
    Variant("own-bl-stickyq", stall="none", bound="seq", sticky="q"),
    Variant("slack-bl-stickyq", bound="seq", sticky="q", slack="raw"),
    Variant("slackcap-bl-stickyq", bound="seq", sticky="q", slack="cap"),
    Variant("kv-stickyq", bound="kv", sticky="q"),
    Variant("bl-kv-stickyq", bound="seq+kv", sticky="q"),
    Variant("tok-stickyq", bound="tok", sticky="q"),
    Variant("bl-tok-stickyq", bound="seq+tok", sticky="q"),
    Variant("slackhalf-bl-stickyq-tb", bound="seq", sticky="q", slack="half", tie="b"),
    Variant("slackhalf-bl-stickyq-tr", bound="seq", sticky="q", slack="half", tie="r"),
    Variant("slackhalf-bl-stickyqi", bound="seq", sticky="qi", slack="half"),
    Variant("slackhalf-bl-stickyqi-tb", bound="seq", sticky="qi", slack="half", tie="b"),
    Variant("slackhalf-bl-stickyqn", bound="seq", sticky="qn", slack="half"),
    Variant("slackhalf-bl-stickyq-tkv", bound="seq", sticky="q", slack="half", tie="kv"),
    Variant("slackhalf-bl-stickyq-tbkv", bound="seq", sticky="q", slack="half", tie="bkv"),
    Variant("slackhalf-bl-stickyq-dec", bound="seq", sticky="q", slack="half", dec="full"),
    Variant("slackhalf-bl-stickyq-decg", bound="seq", sticky="q", slack="half", dec="gets"),
    Variant("slackhalf-bl-stickyqd", bound="seq", sticky="qd", slack="half"),
    Variant("slackhalf-bl-stickyqdf", bound="seq", sticky="qdf", slack="half"),
    Variant("slackhalf-bl-stickyqdb", bound="seq", sticky="qdb", slack="half"),
    Variant("slackhalf-bl-stickyqdm", bound="seq", sticky="qdm", slack="half"),
    Variant("slackhalf-bl-stickyqdc", bound="seq", sticky="qdc", slack="half"),
    Variant("slackhalf-bl-stickyqm", bound="seq", sticky="qm", slack="half"),
    Variant("slackhalfcap-bl-stickyq", bound="seq", sticky="q", slack="halfcap"),
    Variant("slackhalfcap-bl-stickyqdm", bound="seq", sticky="qdm", slack="halfcap"),
    Variant("slackhalfq-bl-stickyq", bound="seq", sticky="q", slack="halfq"),
    Variant("slackhalf-bl-stickyqd-dec", bound="seq", sticky="qdf", slack="half", dec="full"),
    Variant("slackidle-bl-stickyq", bound="seq", sticky="q", slack="idle"),
    Variant("slackexcess-bl-stickyq", bound="seq", sticky="q", slack="excess"),
    Variant("slackidleexcess-bl-stickyq", bound="seq", sticky="q", slack="idleexcess"),
    Variant("slackhalf-bl-stickyqs", bound="seq", sticky="qs", slack="half"),
    Variant("slackhalf-bl-stickyqsw", bound="seq", sticky="qsw", slack="half"),
    Variant("slackhalf-bl-stickyqsi", bound="seq", sticky="qsi", slack="half"),
    Variant("slackhalf-bl-stickyq-trq0", bound="seq", sticky="q", slack="half", tie="rq0"),
    Variant("own-room", stall="none", bound="room"),
    Variant("bl-room", bound="seq+room"),
    Variant("bl-stickyq-room", bound="seq+room", sticky="q"),
)}
MOONCAKE = "mooncake_conversation_trace.jsonl"
WORKLOADS = {
    "mooncake-tune": ("trace:{traces}/" + MOONCAKE, 3000, 0),
    "chatbot": ("chatbot", 3000, 0),
    # the tuning half in three windows of the reported points' size (1,000 requests): a short
    # run's start-up and its deadlines weigh as they do on the reported points
    "mooncake-tune-a": ("trace:{traces}/" + MOONCAKE, 1000, 0),
    "mooncake-tune-b": ("trace:{traces}/" + MOONCAKE, 1000, 1000),
    "mooncake-tune-c": ("trace:{traces}/" + MOONCAKE, 1000, 2000),
    # reported workloads (routing_sweep.py's), never used to choose: here only to show what a
    # change of the default did there, after it was chosen
    "mooncake-report": ("trace:{traces}/" + MOONCAKE, 3000, 6016),
    "api": ("api", 4000, 0),
    "coder": ("coder", 2000, 0),
    "azure-conv": ("azure-conv-prefix", 3000, 0),
}

def trace_dir_spec(spec: str, traces: str) -> str:
    """`spec` with its trace folder filled in; the bundled traces are gzipped (.jsonl.gz)."""
    path = spec.format(traces=traces)
    if path.startswith("trace:") and not Path(path[6:]).exists() and Path(path[6:] + ".gz").exists():
        path += ".gz"
    return path



def router_policy(name: str) -> str:
    """The router policy that runs `name`: a variant, registered under `ablation-NAME`, or a
    router policy as it is (a peer)."""
    if name not in VARIANTS:
        return name
    v = VARIANTS[name]
    core.POLICIES[f"ablation-{name}"] = lambda cfg, rng, v=v: core.Policy(
        v, guards=[BoundGuard(v.bound, v.c, v.sticky)] if v.bound else [])
    return f"ablation-{name}"


def reported(name: str, policy: str, out: Path, traces: str, requests: int, peers: Path = rs.ROOT / "docs" / "results" / "routing") -> str:
    """Variant `name` (router policy `policy`) on every reported cell of bench.routing_sweep, as the
    default's entry of a copy of the committed cell's JSON in `out` (the peers' runs are
    unchanged: the simulator is deterministic); returns routing_sweep's comparison with the
    committed default."""
    out.mkdir(parents=True, exist_ok=True)
    line = f"python -m bench.routing_ablation --only {name} --requests {requests} --reported {out.parent.name}"
    for wname, (spec, _, skip, kind) in rs.WORKLOADS.items():
        if kind != "reported":
            continue
        for load in rs.LOADS:
            doc = json.loads((peers / f"{wname}_x{load:g}.json").read_text())
            if doc["config"].get("num_requests") != requests:
                raise SystemExit(f"{peers}: its {wname} ×{load:g} holds another request count than {requests}")
            w = open_workload(trace_dir_spec(spec, traces), num_requests=requests, rate_scale=load, seed=0,
                              skip_requests=skip)
            r = simulate(w, SimConfig(instances=16, profile="a100-llama3-8b", policy=policy, seed=0),
                         {"ttft": 2000.0, "tpot": 100.0})
            doc["policies"][rs.DEFAULT] = r
            doc.setdefault("commands", {})[rs.DEFAULT] = line
            (out / f"{wname}_x{load:g}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return f"## {name}\n\n" + rs.versus(out, peers)


PEERS = ("dynamo", "llmd", "llmd-token-load", "sglang", "least-loaded")
"""The peer policies the variant benches (routing_decode_load, routing_estimates) set beside theirs."""


def tune_table(names: list[str], register, workloads: str, loads: str, peers=PEERS) -> None:
    """Each variant of `names` (its policy `register(name)`) and each peer, on each tuning
    workload and load: one markdown row each (the variant benches' `--tune`)."""
    print("| workload | load | variant | TTFT mean (ms) | TPOT p99 (ms) | hit | goodput (req/s) | failed |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for wname in workloads.split(","):
        spec, n, skip = WORKLOADS[wname]
        for load in (float(x) for x in loads.split(",")):
            w = open_workload(trace_dir_spec(spec, str(TRACES)), num_requests=n, rate_scale=load,
                              skip_requests=skip, seed=0)
            for name in [*names, *peers]:
                policy = name if name in PEERS else register(name)
                r = simulate(w, SimConfig(instances=16, profile="a100-llama3-8b", policy=policy, seed=0),
                             {"ttft": 2000.0, "tpot": 100.0})
                print(f"| {wname} | ×{load:g} | {name} | {r['mean_ttft_ms']:.1f} | {r['p99_tpot_ms']:.1f} | "
                      f"{r['prefix_hit_ratio']:.3f} | {r['request_goodput']:.2f} | {r['failed']} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(TRACES),
                    help="folder holding mooncake_conversation_trace.jsonl[.gz] (default: the bundled traces)")
    ap.add_argument("--loads", default="1,2,3",
                    help="loads, each a multiplier of the workload's arrival rate, comma list (default: %(default)s)")
    ap.add_argument("--only", default=",".join(VARIANTS),
                    help=f"variants, or router policies run as they are (default all variants: {','.join(VARIANTS)})")
    ap.add_argument("--workloads", default="mooncake-tune,chatbot",
                    help=f"workloads to run, comma list of {', '.join(WORKLOADS)} (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=None, help="requests per point (default: the workload's)")
    ap.add_argument("--seed", type=int, default=0,
                    help="the synthetic workloads' seed (api, coder, chatbot: another draw of the same workload; 0: the figure's)")
    ap.add_argument("--reported", metavar="OUT",
                    help="run each variant on the reported cells beside the committed peers, into OUT/VARIANT (see above)")
    args = ap.parse_args()
    policy = {}  # --only name → the router policy it runs: a variant, or a router policy as-is (a peer)
    for name in args.only.split(","):
        if name not in VARIANTS and name not in core.POLICIES:
            ap.error(f"{name}: neither a variant nor a router policy")
        policy[name] = router_policy(name)
    goodput = {"ttft": 2000.0, "tpot": 100.0}
    if args.reported:
        for name in args.only.split(","):
            print(reported(name, policy[name], Path(args.reported) / name, args.traces, args.requests or 1000))
        return 0
    print("| workload | load | variant | TTFT mean (ms) | TTFT p50 | TTFT p99 | TPOT p99 (ms) | hit | goodput (req/s) | preemptions | failed | mean batch, least loaded instance |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wname in args.workloads.split(","):
        spec, n, skip = WORKLOADS[wname]
        n = args.requests or n
        if "{traces}" in spec and not args.traces:
            ap.error("--traces DIR is needed for the Mooncake workload")
        for load in (float(x) for x in args.loads.split(",")):
            w = open_workload(trace_dir_spec(spec, args.traces), num_requests=n, rate_scale=load, skip_requests=skip,
                              seed=args.seed)
            for name in args.only.split(","):
                t = time.perf_counter()
                r = simulate(w, SimConfig(instances=16, profile="a100-llama3-8b", policy=policy[name], seed=args.seed),
                             goodput)
                print(f"| {wname} | ×{load:g} | {name} | {r['mean_ttft_ms']:.0f} | {r['median_ttft_ms']:.0f} | "
                      f"{r['p99_ttft_ms']:.0f} | {r['p99_tpot_ms']:.1f} | {r['prefix_hit_ratio']:.3f} | "
                      f"{r['request_goodput']:.2f} | {r.get('preemptions', 0)} | {r['failed']} | "
                      f"{r['load_balance']['batch_size_mean_min']:.1f} |", flush=True)
                print(f"  ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
