"""SLO feasibility: will a request of class c meet its TTFT deadline if admitted now?

    wait(c)   = ahead(c) / D
    refuse    ⇔ wait(c) + H > budget (the class target: P0 0.5 s, P1 5 s, P2 60 s — a
                request's own prefill is added to its deadline, not charged to the wait; P3
                has none and is never refused here; or the client's ttft_slo_ms, whose own
                prefill admission checks once the prompt is tokenized); H = the engine backlog
                a released request may still wait behind (shared.slo, 0.25 s)
    Retry-After = wait(c) + H − budget   (when, at this drain rate, the backlog would fit)

D, the fleet's drain rate, is the work (prompt + max_tokens) the priority queue routed per
second over its last few seconds, summed over fresh queue replicas: the queue releases work
only into the headroom its flow control judges from the workers' heartbeats, so D is what the
fleet absorbs. While the headroom the queues report (their flow control's room, in prompt
tokens; 0 while a queue pauses after a refused route) exceeds the prompt tokens admitted since,
the queue is not the bottleneck: what waits is about to leave, wait = 0. Without headroom and
with no drain measured (a burst after a quiet spell), D is the fresh workers' prefill rate
Σ 1 / (s per token); with neither, nothing is predicted (wait = 0). With no fresh queue state (no queue yet) nothing is predicted and nothing refused.

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
what keeps the 30k–126k-token prompts of a saturated fleet from stalling everyone's decodes. Heartbeats add fleet health: once workers have been seen, if none is fresh and healthy the
wait is unbounded (every class with a deadline is refused: 503). Work admitted since the last queue
state is added to W at once and counts until a queue state shows the queue has taken it in
(QueueStats.seen_arrival_s), so a burst the queue has not yet fetched cannot all slip in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tokenyard.shared import config
from tokenyard.shared.schemas import Heartbeat, QueueStats
from tokenyard.shared.slo import ENGINE_BACKLOG_S, TTFT_TARGET_S, decode_slack_s

NUM_CLASSES = 4
WEIGHTS = (16.0, 8.0, 4.0, 2.0)
TARGET_S = TTFT_TARGET_S
HYBRID_FAMILY = ("hybrid", "bubble", "fixed", "sjf")


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
    queues: dict[str, tuple[float, QueueStats]] = field(default_factory=dict)
    workers: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """worker id → (seen at, healthy and not draining)."""
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

    def on_queue_stats(self, s: QueueStats, now: float) -> None:
        """A queue state counts what the queue has taken in: every request admitted up to its
        `seen_arrival_s` (the latest replica's; JetStream hands a stream out in order). What was
        admitted after it is still in JetStream or on its way and keeps counting here — a burst
        the queue has not fetched yet would otherwise vanish from the prediction at each state.
        A queue that reports no watermark (0) counts everything admitted before now."""
        self.queues[s.instance_id] = (now, s)
        seen = max((q.seen_arrival_s for _, q in self.queues.values()), default=0.0) if s.seen_arrival_s > 0 else now
        while self.admitted and self.admitted[0][0] <= seen:
            _, c, cost, prompt = self.admitted.popleft()
            self.admitted_work[c] -= cost
            self.admitted_depth -= 1
            self.admitted_prompt -= prompt
        if not self.admitted:  # exact zeros, whatever the float sums drifted to
            self.admitted_work = [0.0] * NUM_CLASSES

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.workers[hb.worker_id] = (now, hb.healthy and not hb.draining)
        s = hb.stats
        if s.prefill_ms_per_token > 0:
            self.prefill_cost[hb.worker_id] = (s.prefill_ms_per_token, s.prefill_ms_per_token2)
        self.tpot_slack_s[hb.worker_id] = decode_slack_s(hb)

    def on_keepalive(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat again, at `now`: the same as `on_heartbeat` with it
        (only its time moves); False for a worker never heard from."""
        seen = self.workers.get(worker_id)
        if seen is None:
            return False
        self.workers[worker_id] = (now, seen[1])
        return True

    def decode_room_s(self, now: float) -> float | None:
        """The longest prefill some fresh, healthy worker can take without pushing its running
        decodes past their TPOT SLO: the largest slack over the workers (∞ where nothing
        decodes); None when no worker reports one (nothing known: nothing refused)."""
        rooms = [math.inf if slack is None else slack for w, slack in self.tpot_slack_s.items()
                 if (seen := self.workers.get(w)) and seen[1] and now - seen[0] <= self.stale_after_s
                 and w in self.prefill_cost]
        return max(rooms) if rooms else None

    def own_prefill_s(self, prompt_len: int, now: float) -> float | None:
        """The request's prefill alone on the fastest fresh, healthy worker; None: unknown."""
        times = [prompt_len * a + prompt_len * prompt_len * b for w, (a, b) in self.prefill_cost.items()
                 if (seen := self.workers.get(w)) and seen[1] and now - seen[0] <= self.stale_after_s]
        return min(times) / 1000.0 if times else None

    def on_admitted(self, c: int, cost: float, prompt_len: int, now: float) -> None:
        self.admitted.append((now, c, cost, prompt_len))
        self.admitted_work[c] += cost
        self.admitted_depth += 1
        self.admitted_prompt += prompt_len

    def _prefill_rate(self, now: float) -> float:
        """The fleet's prompt tokens per second at a full chunk, from the fresh workers' reports."""
        return sum(1000.0 / a for w, (a, _) in self.prefill_cost.items()
                   if (seen := self.workers.get(w)) and seen[1] and now - seen[0] <= self.stale_after_s)

    def _fresh_queues(self, now: float) -> list[QueueStats]:
        return [s for seen, s in self.queues.values() if now - seen <= self.stale_after_s]

    def fleet_down(self, now: float) -> bool:
        return bool(self.workers) and not any(
            ok and now - seen <= self.stale_after_s for seen, ok in self.workers.values()
        )

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
        drain = sum(s.drain_tokens_per_s for s in qs)
        if self.fleet_down(now):
            wait = float("inf")
        elif ahead <= 0 or sum(s.headroom for s in qs) > self.admitted_prompt:
            wait = 0.0
        elif drain > 0:
            wait = ahead / drain
        else:  # nothing routed lately (a burst after a quiet spell): the workers' prefill rate
            rate = self._prefill_rate(now)
            wait = ahead / rate if rate > 0 else 0.0  # no rate known at all: nothing to predict from
        return Verdict(wait, deadline, depth)
