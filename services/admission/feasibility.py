"""SLO feasibility: will a request of class c meet its TTFT deadline if admitted now?

    wait(c)   = min( ahead(c) / (D − λ(c)),  (ahead(c) + λ(c)·T) / D )     (λ(c) = 0: ahead(c) / D)
    refuse    ⇔ wait(c) + H > budget (the class target: P0 0.5 s, P1 5 s, P2 60 s — a
                request's own prefill is added to its deadline, not charged to the wait; P3
                has none and is never refused here; or the client's ttft_slo_ms, whose own
                prefill admission checks once the prompt is tokenized); H = the engine backlog
                a released request may still wait behind (shared.slo, 0.25 s)
    Retry-After = wait(c) + H − budget   (when, at this drain rate, the backlog would fit)

While every worker up is one admission has not heard from since its own return from a bus outage
(up by liveness.py's excuse, silent past its bound), wait(c) is at least the excuse left: the
longest it may yet take to reconnect, before which it serves nothing.

D, the fleet's drain rate, is the work (prompt + max_tokens) the priority queue routed per
second over its last few seconds, summed over fresh queue replicas, no more than what the
fleet sustains over the wait the request may have, D_s(budget − H) below (on by default,
FleetView.cap_at_sustainable): the queue releases work only into the headroom its flow control
judges from the workers' heartbeats, so the measured D is what the fleet absorbs now. It is
also capped, while the queues run flow control (QueueStats.flow_control), at D_r, the most that
flow control can release (wait_terms.py):

    D_r      = Σ_w min(H / a_w, kv_free_w) / i_w · (P + M) / P

each fresh worker's whole room in prompt tokens (a_w its prefill cost per token, i_w its
heartbeat interval, P and M below), once per heartbeat: the queue sends a worker no more than
its room, that room reopens only with the worker's next heartbeat, and a prompt counts whole,
cached or not (the decodes' TPOT slack, which lowers a room, is left out: it returns as they
finish, and D_r stays an upper bound; a worker in a decode phase is counted alike). On a flash crowd of cached prompts (`bench.overload --workload api`, ×5) the
engines run at 2–9 % of their token budget while the queue drains at D_r, ~0.6 of their D_s. While the
headroom the queues report (their flow control's room, in prompt tokens; 0 while a queue
pauses after a refused route) exceeds the prompt tokens admitted since, the queue is not the
bottleneck: what waits is about to leave, wait = 0. Without headroom and with no drain
measured (a burst after a quiet spell or a trickle: the queue measures its drain only once it
has held a backlog for 0.25 s, since what leaves an empty queue is the demand, not the fleet's
capacity), D = D_s(budget − H); with neither, nothing is predicted (wait = 0). With no fresh
queue state (no queue yet) nothing is predicted and nothing refused.

The sustainable drain D_s foresees the decodes a backlog's requests will run. The queue
routes a request once its prompt is prefilled at the rate the engines' flow control allows,
and counts its whole work then; its decode is still to come. Early in a burst the engines
prefill at a fresh engine's rate (few decodes beside; their TPOT slack spans their whole
output) and the measured D is that rate; as the burst's decodes accumulate, every step carries
them and D falls. What the fleet sustains in the long run is what each request costs an engine
in all, its prefill c_p and its M' decode tokens of c_d each:

    c_p      = a_w·P' + b_w·P'²,   c_d = a_w + d_w·(P + M'/2)      ms, on worker w
    D_s      = Σ_w (P + M) / (c_p + M'·c_d)                        work tokens per second

but a request waits for no longer than its budget, and a decode lives L_w = M'·step_w (step_w
its worker's reported step time, at least c_d), seconds to tens of seconds: over a wait w the
decodes of the requests routed from now on reach only part of their steady state, while the
n_w decodes running now (Heartbeat running) finish. With remaining lives uniform on [0, L],
over w the share of today's decodes still running is k = 1 − w/2L (w ≤ L), L/2w (w > L), and
the new ones reach 1 − k of their steady state on average, so

    D_s(w)   = Σ_w (1 − n_w·(c_d/step_w)·k) · (P + M) / (c_p + M'·c_d·(1 − k))
               (n_w·c_d/step_w: the share of the engine today's decodes hold; D_s(∞) = D_s)

and admission caps the measured drain at D_s(w) with w = the request's budget − H, the longest
it may wait (P1: 4.75 s; P2: 59.75 s, about the steady state). A short overload (a 20-request
coder burst; ChatBot ×9's peak) is judged by what the fleet does over the wait, not by a steady
state it never reaches; a burst that keeps coming meets the decodes it piles up.
    P, M     the mean prompt and max_tokens of the requests admitted lately (EWMA);
    M'       = M·s, s the share of max_tokens the fleet's requests actually run (the mean of the
               fresh workers' Heartbeat.output_share; 1 before any reports one): a request that
               stops at EOS long before its max_tokens costs the engines only what it ran, while
               the queue's work counts its max_tokens;
    P'       = min(P·(1 − h), N): cached prompt tokens are not prefilled. h is the fleet's
               prefix-cache hit share (Σ prefix_hits / Σ prefix_queries over the fresh workers),
               which trails a burst whose own prompts share prefixes (a coder session's turns);
               N, the mean of the prompt tokens that no prompt admitted lately shared (EWMA):
               admission remembers every PREFIX_STRIDE-th block hash of what it admitted, no
               more blocks than the fleet's KV holds (Σ kv_blocks_used + kv_blocks_free),
               forgetting a chain's tail before its head as an engine does
    a_w, b_w its reported prefill costs (prefill_ms_per_token, prefill_ms_per_token2): a decode
               token rides a mixed step at a prompt token's linear cost
    d_w      its reported decode attention per context token (decode_ms_per_ctx_token; 0:
               unknown, the linear part alone), at a decode's mean context P + M'/2
D_s is known only while every fresh, healthy worker reports a prefill cost (a vLLM worker
reports one once it has measured a prefill); else no cap (None).

λ(c), the work that arrives after a class-c request and still leaves before it: the work per
second admitted lately in the classes that overtake c (`overtaking`: under strict priority every
higher class; under the hybrid family and hybrid-wfq, P0, the strict tier — the fair tier orders
P1 and P2 by release time, so a later P1 does not pass a waiting P2 whose release is due first;
fcfs, wfq, drr: none). Admission measures it from what it admits (it sees every arrival first):
over the last T = ARRIVAL_WINDOW_S (the queue's drain window), since the oldest admission in
it, over no less than ARRIVAL_MIN_SPAN_S. The drain left for class c is D − λ(c), the textbook
priority-queue wait; but a rate measured over T says nothing of the overload beyond T (a burst
of P0 may end in a second), so the overtaking work is counted for at most T: the second term,
equal to the first at wait = T and the smaller beyond it. λ(c) ≥ D therefore means a long but
finite wait, not an infinite one. Without overtaking arrivals the prediction is ahead(c) / D.

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
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenyard.services.admission.liveness import Liveness
from tokenyard.services.admission.wait_terms import (  # the wait's pure formulas; re-exported
    ARRIVAL_WINDOW_S,
    NUM_CLASSES,
    overtaking,
    priority_wait,
    release_rate,
    still_decoding,
    work_ahead,
)
from tokenyard.shared import config, staleness
from tokenyard.shared.schemas import Heartbeat, QueueStats
from tokenyard.shared.slo import ENGINE_BACKLOG_S, TTFT_TARGET_S, decode_slack_s

TARGET_S = TTFT_TARGET_S
ARRIVAL_MIN_SPAN_S = ENGINE_BACKLOG_S
"""λ is never measured over less than this (H, what one release fills): a request or a handful
admitted at one instant is not a rate."""
PREFIX_STRIDE = 4
"""Admission remembers every 4th block hash of a prompt's chain (a chain hash names its whole
prefix): a shared prefix is found to within 4 blocks, at a quarter of the memory."""
KNOWN_PREFILL_S = 600.0
"""A worker's prefill cost counts for the class-cap 400 (`best_prefill_s`) while it was heard from
within this (ten minutes: a stale spell or a restart, not a decommissioned worker's)."""
SHAPE_WEIGHT = 1 / 32
"""The weight of each admitted request in the mean request shape (P, M) of the sustainable
drain: the shape of about the last 32 requests, what a queue's backlog is made of."""


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
    cap_at_sustainable: bool = True
    """Cap a measured drain at D_s(w) over the request's wait budget (not only use it when
    nothing is measured); off: the measured drain alone, which early in a burst is a fresh
    engine's rate and admits requests that then expire (docs/results-priorities.md §3). Round
    4's cap at the steady state D_s(∞) over-refused short overloads and was off by default."""
    overtaking_counted_s: float = ARRIVAL_WINDOW_S
    """How long overtaking arrivals are counted in a wait (T, the module's formula); ∞: over the
    whole wait, the textbook form round 6 set aside (it over-refuses once a short burst of a
    higher class measures λ ≥ D); another value only for bench.burst_forecast's comparison."""
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
    arrivals: deque[tuple[float, int, float]] = field(default_factory=deque)
    """(time, class, cost) of every request admitted within the last ARRIVAL_WINDOW_S, oldest
    first: the work arriving per class (λ_k), which admission sees first."""
    arrival_work: list[float] = field(default_factory=lambda: [0.0] * NUM_CLASSES)
    """Σ cost per class over `arrivals`."""
    decoding: dict[str, tuple[int, float]] = field(default_factory=dict)
    """worker id → (its running decodes, its last step time in ms), as it reported them."""
    release: dict[str, float] = field(default_factory=dict)
    """worker id → R_w, the prompt tokens per second the queue's flow control can release to it
    (wait_terms.release_rate, from its latest heartbeat)."""
    beats_heard: int = field(default=0, repr=False, compare=False)
    """Heartbeats, keep-alives and admission's returns from an outage taken so far: with the time
    and the observer's blind time, the key of `up_at`'s kept answer (a memo's key, not state: left out of equality and repr,
    so a run that folds across ticks and one stepped one by one, which take different numbers
    of keep-alives into the same state, compare equal)."""
    # up_at's kept answer: a memo of what the state above gives, not state itself (a refused
    # request may fill it, and still changes nothing: it is left out of equality)
    _up_key: tuple[float, float, int] | None = field(default=None, init=False, repr=False, compare=False)
    _up: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    kv_blocks: dict[str, int] = field(default_factory=dict)
    """worker id → the KV blocks its GPU holds (used + free): bounds admission's block memory."""
    recent_blocks: dict[int, None] = field(default_factory=dict)
    """Every PREFIX_STRIDE-th block hash of the prompts admitted lately, oldest first, no more
    than the fleet's KV holds (÷ PREFIX_STRIDE): the prefixes the engines may still have cached."""
    new_prompt: float | None = None
    """The prompt tokens of the requests admitted lately that no recent prompt shared (EWMA,
    SHAPE_WEIGHT per request): P' as admission sees it; None until one is admitted."""
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
        self.live.heard(now)
        self.queues[s.instance_id] = (now, s)
        seen = max((q.seen_arrival_s for _, q in self.queues.values()), default=0.0) if s.seen_arrival_s > 0 else now
        while self.admitted and self.admitted[0][0] <= seen:
            _, c, cost, prompt = self.admitted.popleft()
            self.admitted_work[c] -= cost
            self.admitted_depth -= 1
            self.admitted_prompt -= prompt
        if not self.admitted:  # exact zeros, whatever the float sums drifted to
            self.admitted_work = [0.0] * NUM_CLASSES

    def awake(self, now: float, observing: bool = True) -> None:
        """Admission handles an event (a request, a tick) at `now`, cut off from the bus unless
        `observing` (liveness.Liveness.awake); heartbeat and queue state handlers call it too."""
        self.live.awake(now, observing)

    def on_reconnected(self, back_s: float, excuse_s: float) -> None:
        """Admission's connection came back at `back_s`: the workers up when it last heard the bus
        are excused `excuse_s` of silence from then (liveness.Liveness.back)."""
        self.live.back(back_s, excuse_s)
        self.beats_heard += 1  # `up_at`'s kept answer is stale

    def reconnecting(self, now: float) -> tuple[int, float]:
        """Of the workers up now, how many are up only as still reconnecting after admission's
        return from an outage, and the least excuse left when all are (liveness.Liveness.reconnecting)."""
        return self.live.reconnecting(self.up_at(now), now)

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.live.awake(now)
        self.live.beat(hb.worker_id, hb.interval_s, now)
        self.workers[hb.worker_id] = (now, hb.healthy and not hb.draining)
        self.beats_heard += 1
        s = hb.stats
        if s.prefill_ms_per_token > 0:
            self.prefill_cost[hb.worker_id] = (s.prefill_ms_per_token, s.prefill_ms_per_token2)
        self.decode_cost[hb.worker_id] = s.decode_ms_per_ctx_token
        self.prefix[hb.worker_id] = (s.prefix_hits, s.prefix_queries)
        self.decoding[hb.worker_id] = (s.running, s.step_time_ms)
        self.kv_blocks[hb.worker_id] = s.kv_blocks_used + s.kv_blocks_free
        if hb.output_share > 0:
            self.output_share[hb.worker_id] = hb.output_share
        self.tpot_slack_s[hb.worker_id] = decode_slack_s(hb)
        self.release[hb.worker_id] = release_rate(s.prefill_ms_per_token, s.kv_blocks_free * s.block_size,
                                                  hb.interval_s or config.HEARTBEAT_INTERVAL_S)

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now`: the same as `on_heartbeat` with it
        (only its time moves); False for a worker never heard from."""
        seen = self.workers.get(worker_id)
        if seen is None:
            return False
        self.live.awake(now)
        self.live.repeat(worker_id, now)
        self.workers[worker_id] = (now, seen[1])
        self.beats_heard += 1
        return True

    def decode_room_s(self, now: float) -> float | None:
        """The longest prefill some fresh, healthy worker can take without pushing its running
        decodes past their TPOT SLO: the largest slack over the workers (∞ where nothing
        decodes); None when no worker reports one (nothing known: nothing refused)."""
        up = self.up_at(now)
        rooms = [math.inf if slack is None else slack for w, slack in self.tpot_slack_s.items()
                 if w in up and w in self.prefill_cost]
        return max(rooms) if rooms else None

    def own_prefill_s(self, prompt_len: int, now: float) -> float | None:
        """The request's prefill alone on the fastest fresh, healthy worker; None: unknown."""
        up = self.up_at(now)
        times = [prompt_len * a + prompt_len * prompt_len * b for w, (a, b) in self.prefill_cost.items()
                 if w in up]
        return min(times) / 1000.0 if times else None

    def best_prefill_s(self, prompt_len: int, now: float) -> float | None:
        """The request's prefill alone on the fastest worker heard within KNOWN_PREFILL_S, fresh or
        not: what this fleet can do, so a class-cap 400 does not depend on who is up now."""
        times = [prompt_len * a + prompt_len * prompt_len * b for w, (a, b) in self.prefill_cost.items()
                 if w in self.workers and now - self.workers[w][0] <= KNOWN_PREFILL_S]
        return min(times) / 1000.0 if times else None

    def on_admitted(self, c: int, cost: float, prompt_len: int, now: float,
                    chain: Sequence[int] = (), block_size: int = config.BLOCK_SIZE) -> None:
        """Count an admitted request (class c, cost = prompt + max_tokens): in the work the queues
        have not taken in yet, the overtaking rate λ, the request shape, and — from its block-hash
        chain — how much of its prompt a recent prompt shared."""
        shared = self._remember(chain, now)
        new = max(prompt_len - shared * block_size, 0)
        self.new_prompt = float(new) if self.new_prompt is None else self.new_prompt + SHAPE_WEIGHT * (new - self.new_prompt)
        self.admitted.append((now, c, cost, prompt_len))
        self.admitted_work[c] += cost
        self.admitted_depth += 1
        self.admitted_prompt += prompt_len
        self.arrivals.append((now, c, cost))
        self.arrival_work[c] += cost
        self._forget_arrivals(now)
        out = cost - prompt_len
        if self.shape is None:
            self.shape = (float(prompt_len), out)
        else:
            p, m = self.shape
            self.shape = (p + SHAPE_WEIGHT * (prompt_len - p), m + SHAPE_WEIGHT * (out - m))

    def _remember(self, chain: Sequence[int], now: float) -> int:
        """The blocks of `chain` whose prefix a recent prompt shared (to within PREFIX_STRIDE);
        then remembers the chain's sampled hashes as the newest, no more than the KV of the
        workers heard from lately holds (a worker gone silent caches nothing for the fleet)."""
        sampled = chain[PREFIX_STRIDE - 1::PREFIX_STRIDE]
        memory = self.recent_blocks
        shared = 0
        for h in sampled:
            if h not in memory:
                break
            shared += PREFIX_STRIDE
        bound = sum(b for w, b in self.kv_blocks.items() if self.live.fresh(w, now)) // PREFIX_STRIDE
        if bound <= 0:  # no worker heard from lately: nothing known to hold a cache
            return shared
        for h in reversed(sampled):  # the prefix newest: the deepest blocks are forgotten first,
            memory.pop(h, None)      # as an engine's LRU frees a chain's tail before its head
            memory[h] = None
        while len(memory) > bound:
            del memory[next(iter(memory))]
        return shared

    def _forget_arrivals(self, now: float) -> None:
        while self.arrivals and self.arrivals[0][0] <= now - ARRIVAL_WINDOW_S:
            _, k, cost = self.arrivals.popleft()
            self.arrival_work[k] -= cost
        if not self.arrivals:  # exact zeros, whatever the float sums drifted to
            self.arrival_work = [0.0] * NUM_CLASSES

    def arrival_rate(self, classes: range, now: float) -> float:
        """λ: the work per second admitted in `classes` over the last ARRIVAL_WINDOW_S, measured
        since the oldest admission in it and over no less than ARRIVAL_MIN_SPAN_S."""
        self._forget_arrivals(now)
        if not classes or not self.arrivals:
            return 0.0
        work = max(sum(self.arrival_work[k] for k in classes), 0.0)
        return work / max(ARRIVAL_MIN_SPAN_S, now - self.arrivals[0][0])

    def sustainable_drain(self, now: float, horizon_s: float = math.inf) -> float | None:
        """D_s(w) (the module's formula): the work per second the fresh, healthy workers sustain
        over the next `horizon_s` while the decodes running now and those of the requests they
        take run too (w = ∞: the steady state); None: unknown (no request admitted yet, no fresh
        worker, or one that reports no prefill cost), and also where the model leaves nothing
        free on any worker (the running decodes' modelled cost fills every step over the
        horizon): the model is priced with the newcomer's shape, not the running decodes' own
        contexts, so a 0 there is as likely its error as a full fleet, and refusing every
        request with work ahead on it would be an over-refusal — the measured drain decides."""
        if self.shape is None:
            return None
        up = self.up_at(now)
        fresh = [w for w in self.workers if w in up]
        if not fresh or any(w not in self.prefill_cost for w in fresh):
            return None
        p, m = self.shape
        hits = sum(self.prefix.get(w, (0, 0))[0] for w in fresh)
        queries = sum(self.prefix.get(w, (0, 0))[1] for w in fresh)
        computed = p * (1.0 - hits / queries) if queries > 0 else p
        if self.new_prompt is not None:
            computed = min(computed, self.new_prompt)
        shares = [self.output_share[w] for w in fresh if w in self.output_share]
        ran = m * (sum(shares) / len(shares) if shares else 1.0)
        total = 0.0
        for w in fresh:
            a, b = self.prefill_cost[w]
            c_p = a * computed + b * computed * computed
            c_d = a + self.decode_cost.get(w, 0.0) * (p + ran / 2)
            running, step = self.decoding.get(w, (0, 0.0))
            step = max(step, c_d)  # a step carries at least one decode token
            k = still_decoding(horizon_s * 1000.0, ran * step)
            free = max(0.0, 1.0 - running * (c_d / step) * k)
            total += free * (p + m) * 1000.0 / (c_p + ran * c_d * (1.0 - k))
        return total if total > 0 else None

    def release_ceiling(self, now: float) -> float | None:
        """D_r: the work per second the queues' flow control can release to the fresh, healthy
        workers, Σ_w R_w · (P + M) / P (its room is in prompt tokens, the queue's work counts
        max_tokens too); None: unknown (no request shape, no fresh worker, one that reports no
        prefill cost, or no free KV on any)."""
        up = self.up_at(now)
        rates = [self.release.get(w, math.inf) for w in self.workers if w in up]
        if self.shape is None or self.shape[0] <= 0 or not rates or math.isinf(total := sum(rates)) or total <= 0:
            return None
        p, m = self.shape
        return total * (p + m) / p

    def _fresh_queues(self, now: float) -> list[QueueStats]:
        return [s for seen, s in self.queues.values() if now - seen <= self.stale_after_s]

    def up(self, worker_id: str, now: float) -> bool:
        """Healthy, not draining, and heard from within its liveness bound (liveness.py)."""
        seen = self.workers.get(worker_id)
        return seen is not None and seen[1] and self.live.fresh(worker_id, now)

    def up_at(self, now: float) -> frozenset[str]:
        """The workers `up` at `now`, kept until the time, a heartbeat or keep-alive, or the
        observer's blind time (the only inputs of `up`) changes: admission asks at every
        arrival in two or three passes over the fleet (own prefill, decode room, drain)."""
        key = (now, self.live.blind_s, self.beats_heard)
        if key != self._up_key:
            self._up = frozenset(w for w in self.workers if self.up(w, now))
            self._up_key = key
        return self._up

    def fleet_down(self, now: float) -> bool:
        """No worker is up: workers have been seen and none is up now, or admission has watched
        the bus for longer than a worker's staleness bound and heard none at all (a fleet started
        without workers). Every class with a deadline is then refused."""
        if not self.workers:  # watched, net of its own stalls, longer than a worker may be silent
            first = self.live.first_event_s
            bound = max(self.stale_after_s, staleness.stale_after_s(0.0))
            return first is not None and now - first - self.live.blind_s > bound
        return not any(self.up(w, now) for w in self.workers)

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
            drain = self.drain(qs, now, deadline - ENGINE_BACKLOG_S)
            wait = 0.0 if drain is None else priority_wait(
                ahead, drain, self.arrival_rate(overtaking(qs[0].policy, c), now), self.overtaking_counted_s)
            # (None: no rate known at all, nothing to predict from)
        if wait != float("inf"):  # every worker up still reconnecting: serves no sooner than it is back
            wait = max(wait, self.reconnecting(now)[1])
        return Verdict(wait, deadline, depth)

    def drain(self, qs: list[QueueStats], now: float, horizon_s: float = math.inf) -> float | None:
        """D: the measured drain, capped (`cap_at_sustainable`) at what the fleet sustains over
        the wait a request may have (`horizon_s`: its deadline less H); nothing routed lately (a
        burst after a quiet spell): the sustainable one; None: neither is known."""
        measured = sum(s.drain_tokens_per_s for s in qs)
        sustainable = self.sustainable_drain(now, horizon_s)
        ceiling = self.release_ceiling(now) if all(s.flow_control for s in qs) else None
        if ceiling is not None:
            sustainable = ceiling if sustainable is None else min(sustainable, ceiling)
        if sustainable is None:
            return measured if measured > 0 else None
        if measured <= 0 or any(sum(s.depth) and not s.drain_measured for s in qs):  # a replica's work, unmeasured
            return sustainable
        return min(measured, sustainable) if self.cap_at_sustainable else measured
