"""The TTFT guard of SCORPIO (seed 003; DESIGN §3.5): a waiting request that can no longer get
its first token by its deadline is rejected as soon as that is known, not once the deadline
has passed — it would only take prefill time from the requests behind it that still can.

    step(D)    the policy's optimistic step beside a set D of running decodes (`prefill_step`):
               (prompt tokens it prefills n_D, its seconds τ_D) — vLLM: max_num_batched_tokens
               − |D| tokens beside every decode; SCORPIO: the most tokens of one chunk on no
               cached context that fit min STP(D) beside VBS(D) decodes
    epochs     decode r leaves after rem(r) = max_tokens − generated more steps at the earliest
               (one token every step). Steps [b_j, b_j+1) are priced with D_j = the decodes with
               rem ≥ b_j+1 (present through the whole epoch; those leaving inside it are left
               out from its start); b = 0 then every ⌈|D|/16⌉-th rem in ascending order, so at
               most ~16 epochs; after the last decode leaves, empty-engine steps for ever
    T(W)       seconds to prefill W prompt tokens: the epochs in turn, epoch j prefilling
               (b_j+1 − b_j)·n_j tokens in (b_j+1 − b_j)·τ_j seconds, the last one pro rata
    work(w)    prompt tokens still to prefill ahead of w: the running requests' remaining
               prefill + the uncached prompts of the waiting requests served before w (the
               line's own order) that are not rejected themselves
    host(w)    seconds of host-link copies ahead of w and its own: a prefix hit in the host
               tier (CPU offload) is not prefilled, it is copied back to the GPU at the host
               link's rate, and the copy lengthens the step that makes it (admit.py)
    reject w   when it never started and now + T(work(w) + own(w)) + host(w) > its TTFT
               deadline (shared.slo.request_deadline_s)

It errs on keeping: every term is priced as the engine could at best do it — decodes leave at
their earliest and are dropped from an epoch's start, contexts do not grow, one chunk a step on
no cached context, no prefilled request turns into a decode, no KV wait, no VBS hold, no later
arrival served ahead (tests/test_sim_scorpio_guard.py checks that no rejected request would have
made its deadline kept). An engine that can prefill nothing beside its decodes for ever
(n = 0 in every epoch, T = ∞) rejects only what is past its deadline. A preempted request's
remaining prefill counts from its prompt only (a swapped decode owes none).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.admit import prefix_hit
from tokenyard.shared.slo import request_deadline_s

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.seq import Seq

EPOCHS = 16
"""About how many epochs the decodes' departures are priced in (each leaves out at most
⌈|D| / EPOCHS⌉ − 1 decodes early): the guard's cost per step against its precision."""


def full_step(core: SimEngineCore, decodes: list[Seq]) -> tuple[int, float]:
    """vLLM's step beside `decodes`: every decode, and max_num_batched_tokens − |decodes| prompt
    tokens of one chunk on no cached context — (prompt tokens, seconds, the live overhead in)."""
    prof = core.prof
    d = len(decodes)
    n = max(0, prof.max_num_batched_tokens - d)
    ctx = sum(s.req.prompt_len + s.generated for s in decodes)
    ms = prof.step_ms(d + n, d, ctx, prof.chunk_attn_ms(n, 0) if n else 0.0)
    return n, ms / 1000.0 + core.step_overhead_s


def uncached(core: SimEngineCore, seq: Seq) -> tuple[int, int]:
    """(prompt tokens `seq` would still prefill, tokens of its prefix copied back from the host
    tier): its target less its cached prefix, GPU blocks then host blocks — admit.py's lookup."""
    if not seq.req.block_hashes:
        return seq.target, 0
    gpu, host = prefix_hit(core, seq)
    bs = core.block_size
    return seq.target - (gpu + host) * bs, host * bs


class PrefillClock:
    """T(W) of the module docstring, for the engine as it is now; epochs priced as asked."""

    def __init__(self, core: SimEngineCore) -> None:
        self.core = core
        decodes = [s for s in core.running if s.computed >= s.target]
        decodes.sort(key=lambda s: s.max_tokens - s.generated)
        self._decodes = decodes
        self._rems = [s.max_tokens - s.generated for s in decodes]
        k = max(1, math.ceil(len(decodes) / EPOCHS))
        ends = self._rems[k - 1 :: k]
        if decodes and ends[-1] != self._rems[-1]:
            ends.append(self._rems[-1])
        self._ends = ends
        """b_1, b_2, …: the step each epoch ends at."""
        self._epochs: list[tuple[float, float, int, float]] = []
        """(tokens by its end, seconds by its end, n, τ) per epoch priced so far."""
        self._last = 0
        """The epoch the last `seconds` answer fell in."""

    def _epoch(self, j: int) -> tuple[float, float, int, float]:
        while len(self._epochs) <= j:
            i = len(self._epochs)
            tokens, secs = self._epochs[-1][:2] if self._epochs else (0.0, 0.0)
            if i < len(self._ends):
                end = self._ends[i]
                start = self._ends[i - 1] if i else 0
                present = self._decodes[bisect_left(self._rems, end):]  # rem ≥ b_j+1
                n, tau = self.core.policy.prefill_step(self.core, present)
                steps = end - start
                self._epochs.append((tokens + steps * n, secs + steps * tau, n, tau))
            else:
                n, tau = self.core.policy.prefill_step(self.core, [])
                self._epochs.append((math.inf, math.inf, n, tau))
        return self._epochs[j]

    def seconds(self, work: float) -> float:
        """T(work): seconds to prefill `work` prompt tokens (∞ where it never can). The line's
        walk asks with growing work: the search starts at the epoch the last answer was in."""
        if work <= 0:
            return 0.0
        j = self._last if self._last and work > self._epochs[self._last - 1][0] else 0
        while True:
            tokens_end, _, n, tau = self._epoch(j)
            if work <= tokens_end:
                self._last = j
                tokens0, secs0 = self._epochs[j - 1][:2] if j else (0.0, 0.0)
                return secs0 + (work - tokens0) / n * tau if n else math.inf
            j += 1


def unattainable(core: SimEngineCore, now: float) -> list[Seq]:
    """The waiting requests, never started, whose first token cannot come by their deadline."""
    clock = PrefillClock(core)
    prof = core.prof
    work = sum(s.target - s.computed for s in core.running if s.computed < s.target)
    copies = 0.0  # seconds of host-tier copies ahead
    late: list[Seq] = []
    for seq in core.waiting.ordered():
        if seq.started or seq.generated:  # preempted: it runs again, ahead of the rest
            work += max(0, seq.target - seq.computed)  # a swapped decode's computed passes its target
            continue
        own, host = uncached(core, seq)
        copy = prof.transfer_s(host) if host else 0.0
        wait = clock.seconds(work + own) + copies + copy
        first_token = now + wait if wait < math.inf else now  # never: only what is past its deadline
        if first_token > request_deadline_s(seq.req):
            late.append(seq)
        else:
            work += own
            copies += copy
    return late
