"""SLO feasibility: will a request of class c meet its TTFT deadline if admitted now?

    wait(c)   = ahead(c) / D
    refuse    ⇔ wait(c) + H > budget (the class target: P0 0.5 s, P1 5 s, P2 60 s — a
                request's own prefill is added to its deadline, not charged to the wait; P3
                has none and is never refused here; or the client's ttft_slo_ms, whose own
                prefill admission checks once the prompt is tokenized); H = the engine backlog
                a released request may still wait behind (shared.slo, 0.25 s)
    Retry-After = wait(c) + H − budget   (when, at this drain rate, the backlog would fit)

D, the fleet's drain rate, is the work (prompt + max_tokens) the priority queue routed per
second over its last few seconds, summed over fresh queue replicas (capped at what the fleet
can sustain, D_s below, only with FleetView.cap_at_sustainable, off by default): the queue releases work only into the headroom its flow control
judges from the workers' heartbeats, so the measured D is what the fleet absorbs. While the
headroom the queues report (their flow control's room, in prompt tokens; 0 while a queue
pauses after a refused route) exceeds the prompt tokens admitted since, the queue is not the
bottleneck: what waits is about to leave, wait = 0. Without headroom and with no drain
measured (a burst after a quiet spell), D = D_s; with neither, nothing is predicted (wait =
0). With no fresh queue state (no queue yet) nothing is predicted and nothing refused.

The sustainable drain D_s foresees the decodes a backlog's requests will run. The queue
routes a request once its prompt is prefilled at the rate the engines' flow control allows,
and counts its whole work then; its decode is still to come. Early in a burst the engines
prefill at a fresh engine's rate (few decodes beside; their TPOT slack spans their whole
output) and the measured D is that rate; as the burst's decodes accumulate, every step carries
them and D falls. What the fleet sustains is what each request costs an engine in all:

    cost_w   = a_w·P' + b_w·P'²  +  M'·(a_w + d_w·(P + M'/2))      ms per request on worker w
    D_s      = Σ_w (P + M) / cost_w                               work tokens per second
    P, M     the mean prompt and max_tokens of the requests admitted lately (EWMA);
    M'       = M·s, s the share of max_tokens the fleet's requests actually run (the mean of the
               fresh workers' Heartbeat.output_share; 1 before any reports one): a request that
               stops at EOS long before its max_tokens costs the engines only what it ran, while
               the queue's work counts its max_tokens;
    P'       = P·(1 − h), h the fleet's prefix-cache hit share (Σ prefix_hits / Σ prefix_queries
               over the fresh workers): cached prompt tokens are not prefilled
    a_w, b_w its reported prefill costs (prefill_ms_per_token, prefill_ms_per_token2): a decode
               token rides a mixed step at a prompt token's linear cost
    d_w      its reported decode attention per context token (decode_ms_per_ctx_token; 0:
               unknown, the linear part alone), at a decode's mean context P + M'/2
D_s is known only while every fresh, healthy worker reports a prefill cost (a vLLM worker
reports one once it has measured a prefill); else no cap (None).

ahead(c), the work that leaves before a class-c request, follows the queue's policy over the
waiting work W_k per class (weights w = 16/8/4/2; aging ignored, so it errs against the low
classes, which have the loosest targets):
    fcfs, unknown        Σ_k W_k
    strict               Σ_{k ≤ c} W_k
    wfq, drr             W_c + Σ_{k ≠ c} min(W_k, W_c · w_k / w_c)
    hybrid-wfq           P0: W_0;  P3: Σ W;  P1, P2: W_0 + W_c + min(W_o, W_c · w_o / w_c),
                         o the other of P1 / P2
    hybrid family        Σ_{k ≤ c} W_k, P3: Σ W (its fair tier serves the earliest release
                         first: a new P1 request's release, 5 s out, comes before nearly every
                         waiting P2's, a minute out; the P2 work due sooner is not counted)
A request's own prefill, once it is tokenized, is predicted on the fastest fresh worker
(`own_prefill_s`: L·a + L²·b, a and b the worker's reported linear and attention costs;
admission does not see the prefix cache, so the whole prompt counts) and extends its TTFT
deadline (shared.slo.ttft_deadline_s): a long prompt is served when the fleet has room.
Decode capacity (`decode_room_s`): a prefill delays every decode running beside it, so a prompt
whose own prefill exceeds the TPOT slack of the running decodes on every fresh worker
(Heartbeat.tpot_slack_ms; a worker with nothing decoding takes any prompt) would push them past
their TPOT SLO wherever it went: 503, Retry-After = its prefill − the largest slack. This is
what keeps the 30k–126k-token prompts of a saturated fleet from stalling everyone's decodes. Heartbeats add fleet health: once workers have been seen, if none is up — healthy and
fresh, that is silent for no more than 10 of the heartbeat intervals it announces or 3 × its
own longest recent gap, net of admission's own stalls (liveness.py) — the
wait is unbounded (every class with a deadline is refused: 503). Work admitted since the last queue
state is added to W at once and counts until a queue state shows the queue has taken it in
(QueueStats.seen_arrival_s), so a burst the queue has not yet fetched cannot all slip in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tokenyard.services.admission.liveness import Liveness
from tokenyard.shared import config
from tokenyard.shared.schemas import Heartbeat, QueueStats
from tokenyard.shared.slo import ENGINE_BACKLOG_S, TTFT_TARGET_S, decode_slack_s

NUM_CLASSES = 4
WEIGHTS = (16.0, 8.0, 4.0, 2.0)
TARGET_S = TTFT_TARGET_S
HYBRID_FAMILY = ("hybrid", "bubble", "bubble-placed", "fixed", "sjf")
SHAPE_WEIGHT = 1 / 32
"""The weight of each admitted request in the mean request shape (P, M) of the sustainable
drain: the shape of about the last 32 requests, what a queue's backlog is made of."""


def work_ahead(policy: str, work: list[float], c: int) -> float:
    if policy == "strict":
        return sum(work[: c + 1])
    if policy in ("wfq", "drr"):
        return work[c] + sum(min(work[k], work[c] * WEIGHTS[k] / WEIGHTS[c]) for k in range(NUM_CLASSES) if k != c)
    if policy in HYBRID_FAMILY:
        return sum(work) if c == 3 else sum(work[: c + 1])
    if policy == "hybrid-wfq":
        if c == 0:
            return work[0]
        if c == 3:
            return sum(work)
        o = 3 - c  # the other fair class: 1 ↔ 2
        return work[0] + work[c] + min(work[o], work[c] * WEIGHTS[o] / WEIGHTS[c])
    return sum(work)


@dataclass
class Verdict:
    wait_s: float
    deadline_s: float
    depth: int

    @property
    def feasible(self) -> bool:
        return self.wait_s == 0.0 or self.wait_s + ENGINE_BACKLOG_S <= self.deadline_s

    @property
    def retry_after_s(self) -> float:
        return self.wait_s + ENGINE_BACKLOG_S - self.deadline_s


@dataclass
class FleetView:
    stale_after_s: float = config.STALE_AFTER_S
    cap_at_sustainable: bool = False
    """Cap a measured drain at D_s too (not only use D_s when nothing is measured). Off by
    default: it moves the simulated burst's first refusal from 1.40 to 1.16 s and expires none
    of what it admits, but on a short overload it refuses what the fleet would have served in
    time (ChatBot ×9 on 8 instances: 139 refused, 128 fewer met their deadline; a 20-request
    coder burst on 2 instances: 6 refused, all 20 served without it), because D_s assumes the
    overload lasts as long as the wait it predicts (docs/results-priorities.md §3, §5)."""
    queues: dict[str, tuple[float, QueueStats]] = field(default_factory=dict)
    """queue replica → (seen at, its latest state); a state older than stale_after_s is ignored."""
    workers: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """worker id → (seen at, healthy and not draining); up while `live` finds it fresh."""
    live: Liveness = field(default_factory=Liveness)
    """When a worker counts as gone: its silence against the heartbeat interval it announces and
    is observed at, net of admission's own blind time (liveness.py), not a fixed stale_after_s."""
    prefill_cost: dict[str, tuple[float, float]] = field(default_factory=dict)
    """worker id → its reported prefill costs (ms per token, ms per token²), workers that report one."""
    tpot_slack_s: dict[str, float | None] = field(default_factory=dict)
    """worker id → the prefill time its running decodes can absorb within their TPOT SLO
    (Heartbeat.tpot_slack_ms; None: nothing decodes there)."""
    admitted: deque[tuple[float, int, float, int]] = field(default_factory=deque)
    """(arrival, class, cost, prompt tokens) of what this admission admitted that no queue
    state counts yet, oldest first."""
    admitted_work: list[float] = field(default_factory=lambda: [0.0] * NUM_CLASSES)
    admitted_depth: int = 0
    admitted_prompt: int = 0
    """Sums over `admitted`; its prompt tokens take the headroom the queues reported."""
    decode_cost: dict[str, float] = field(default_factory=dict)
    """worker id → its reported decode attention per context token (ms), workers that report one."""
    prefix: dict[str, tuple[int, int]] = field(default_factory=dict)
    """worker id → its (prefix_hits, prefix_queries), counted since it started."""
    output_share: dict[str, float] = field(default_factory=dict)
    """worker id → its Heartbeat.output_share, workers that report one."""
    shape: tuple[float, float] | None = None
    """(mean prompt tokens, mean max_tokens) of the requests admitted lately: an EWMA, weight
    SHAPE_WEIGHT per request; None until one is admitted."""

    def on_queue_stats(self, s: QueueStats, now: float) -> None:
        """A queue state counts what the queue has taken in: every request admitted up to its
        `seen_arrival_s` (the latest replica's; JetStream hands a stream out in order). What was
        admitted after it is still in JetStream or on its way and keeps counting here — a burst
        the queue has not fetched yet would otherwise vanish from the prediction at each state.
        A queue that reports no watermark (0) counts everything admitted before now."""
        self.live.awake(now)
        self.queues[s.instance_id] = (now, s)
        seen = max((q.seen_arrival_s for _, q in self.queues.values()), default=0.0) if s.seen_arrival_s > 0 else now
        while self.admitted and self.admitted[0][0] <= seen:
            _, c, cost, prompt = self.admitted.popleft()
            self.admitted_work[c] -= cost
            self.admitted_depth -= 1
            self.admitted_prompt -= prompt
        if not self.admitted:  # exact zeros, whatever the float sums drifted to
            self.admitted_work = [0.0] * NUM_CLASSES

    def awake(self, now: float) -> None:
        """Admission handles an event (a request, a tick) at `now` (liveness.Liveness.awake);
        the heartbeat and queue state handlers call it themselves."""
        self.live.awake(now)

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.live.awake(now)
        self.live.beat(hb.worker_id, hb.interval_s, now)
        self.workers[hb.worker_id] = (now, hb.healthy and not hb.draining)
        s = hb.stats
        if s.prefill_ms_per_token > 0:
            self.prefill_cost[hb.worker_id] = (s.prefill_ms_per_token, s.prefill_ms_per_token2)
        self.decode_cost[hb.worker_id] = s.decode_ms_per_ctx_token
        self.prefix[hb.worker_id] = (s.prefix_hits, s.prefix_queries)
        if hb.output_share > 0:
            self.output_share[hb.worker_id] = hb.output_share
        self.tpot_slack_s[hb.worker_id] = decode_slack_s(hb)

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now`: the same as `on_heartbeat` with it
        (only its time moves); False for a worker never heard from."""
        seen = self.workers.get(worker_id)
        if seen is None:
            return False
        self.live.awake(now)
        self.live.beat(worker_id, self.live.beats[worker_id].interval_s, now)
        self.workers[worker_id] = (now, seen[1])
        return True

    def decode_room_s(self, now: float) -> float | None:
        """The longest prefill some fresh, healthy worker can take without pushing its running
        decodes past their TPOT SLO: the largest slack over the workers (∞ where nothing
        decodes); None when no worker reports one (nothing known: nothing refused)."""
        rooms = [math.inf if slack is None else slack for w, slack in self.tpot_slack_s.items()
                 if self.up(w, now) and w in self.prefill_cost]
        return max(rooms) if rooms else None

    def own_prefill_s(self, prompt_len: int, now: float) -> float | None:
        """The request's prefill alone on the fastest fresh, healthy worker; None: unknown."""
        times = [prompt_len * a + prompt_len * prompt_len * b for w, (a, b) in self.prefill_cost.items()
                 if self.up(w, now)]
        return min(times) / 1000.0 if times else None

    def on_admitted(self, c: int, cost: float, prompt_len: int, now: float) -> None:
        self.admitted.append((now, c, cost, prompt_len))
        self.admitted_work[c] += cost
        self.admitted_depth += 1
        self.admitted_prompt += prompt_len
        out = cost - prompt_len
        if self.shape is None:
            self.shape = (float(prompt_len), out)
        else:
            p, m = self.shape
            self.shape = (p + SHAPE_WEIGHT * (prompt_len - p), m + SHAPE_WEIGHT * (out - m))

    def sustainable_drain(self, now: float) -> float | None:
        """D_s (the module's formula): the work per second the fresh, healthy workers sustain
        once the requests they take run their decodes too; None: unknown (no request admitted
        yet, no fresh worker, or one that reports no prefill cost)."""
        if self.shape is None:
            return None
        fresh = [w for w in self.workers if self.up(w, now)]
        if not fresh or any(w not in self.prefill_cost for w in fresh):
            return None
        p, m = self.shape
        hits = sum(self.prefix.get(w, (0, 0))[0] for w in fresh)
        queries = sum(self.prefix.get(w, (0, 0))[1] for w in fresh)
        computed = p * (1.0 - hits / queries) if queries > 0 else p
        shares = [self.output_share[w] for w in fresh if w in self.output_share]
        ran = m * (sum(shares) / len(shares) if shares else 1.0)
        total = 0.0
        for w in fresh:
            a, b = self.prefill_cost[w]
            cost_ms = a * computed + b * computed * computed + ran * (a + self.decode_cost.get(w, 0.0) * (p + ran / 2))
            total += (p + m) * 1000.0 / cost_ms
        return total

    def _fresh_queues(self, now: float) -> list[QueueStats]:
        return [s for seen, s in self.queues.values() if now - seen <= self.stale_after_s]

    def up(self, worker_id: str, now: float) -> bool:
        """Healthy, not draining, and heard from within its liveness bound (liveness.py)."""
        seen = self.workers.get(worker_id)
        return seen is not None and seen[1] and self.live.fresh(worker_id, now)

    def fleet_down(self, now: float) -> bool:
        """Workers have been seen and none is up: every class with a deadline is refused."""
        return bool(self.workers) and not any(self.up(w, now) for w in self.workers)

    def depth(self, now: float) -> int:
        return sum(sum(s.depth) for s in self._fresh_queues(now)) + self.admitted_depth

    def judge(self, c: int, deadline_s: float | None, now: float) -> Verdict | None:
        """None when there is nothing to predict from (no fresh queue state)."""
        qs = self._fresh_queues(now)
        if not qs:
            return None
        deadline = TARGET_S[c] if deadline_s is None else deadline_s
        depth = sum(sum(s.depth) for s in qs) + self.admitted_depth
        work = [sum(s.work_tokens[k] for s in qs) + self.admitted_work[k] for k in range(NUM_CLASSES)]
        ahead = work_ahead(qs[0].policy, work, c)
        if self.fleet_down(now):
            wait = float("inf")
        elif ahead <= 0 or sum(s.headroom for s in qs) > self.admitted_prompt:
            wait = 0.0
        else:
            drain = self.drain(qs, now)
            wait = ahead / drain if drain > 0 else 0.0  # no rate known at all: nothing to predict from
        return Verdict(wait, deadline, depth)

    def drain(self, qs: list[QueueStats], now: float) -> float:
        """D: the measured drain (capped at the sustainable one with `cap_at_sustainable`);
        nothing routed lately (a burst after a quiet spell): the sustainable one; 0: neither
        is known."""
        measured = sum(s.drain_tokens_per_s for s in qs)
        sustainable = self.sustainable_drain(now)
        if sustainable is None:
            return measured
        if measured <= 0:
            return sustainable
        return min(measured, sustainable) if self.cap_at_sustainable else measured
