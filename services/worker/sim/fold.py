"""Decode folding: several pure decode steps of the simulated engine computed as one.

While everyone running decodes, nobody waits, no prefill and no abort is pending and the
policy runs the whole batch every step, the next steps are all alike: step j (from 0) of a
batch of b requests whose contexts sum to C costs

    d_j = (overhead + linear(b) + d0 + d2 · (C + j · b)) / 1000      (LatencyProfile.step_ms)

and gives each request one token. `fold` runs them in closed form, segment by segment
between two finishes (the request with the fewest tokens to go leaves at its segment's end,
the batch shrinks, b and C change), until the batch is empty, a block would run out,
`max_steps`, or a step would end at or after `until` (the caller's next look at the engine);
where the next step is not such a step it returns None (`advance`: one ordinary `step()`).

Blocks are taken per segment and a finishing request frees its blocks after its segment's
allocations, as step by step: the same blocks are evicted, the same KV events come out. The
times are the steps' to the bit (the same float operations in the same order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.preemption import preempt_due
from tokenyard.services.worker.sim.seq import Seq, StepResult, cdiv, filler_tokens

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore


def fold(core: SimEngineCore, now: float = 0.0, until: float = float("inf"),
         max_steps: int = 1 << 30, straddle: bool = False, late_before: float = float("-inf")) -> StepResult | None:
    """The next steps of `core` computed as one, if they are pure decode steps; None if not
    (the caller runs `core.step()`). Step k ends at t_k = now + d_1 + … + d_k (summed left to
    right, as a caller stepping one by one adds them); the fold takes every step with
    t_k < `until` (at least one), up to `max_steps`, and stops early where the batch empties
    or a block would run out. Its result has one output per request with the tokens it made
    (token j at t_(j+1)), `num_steps` and each step's duration.

    With `straddle`, the step that ends at or after `until` is taken too, as the last, where
    the fold delivers nothing before `until` that a caller stepping one by one would have seen
    by then: no request finishes before it and no block is evicted (no KV event). At `until`
    the engine is then as one by one (that step has started), and its result comes once.

    With `late_before`, the step across `until` is taken too wherever it ends before
    `late_before`, whatever the fold delivered before `until`: for a caller whose look at
    `until` reads only the engine itself (its stats), not what the steps delivered, and who
    delivers it all before `late_before` (the simulator's fold across ticks). Without
    `straddle`, that holds for the first step too: None where it would end at or after both.

    Pure decode steps: everyone running has computed its prompt, nobody waits, no abort is
    pending, the policy runs the whole batch every step (`folds`) within its token budget,
    and the engine's step shape is chunked prefill's. What each of these steps would have
    asked of the policy is asked once: `token_budget` (it must hold the batch) and
    `step_batch` (for its bookkeeping; `folds` promised it returns the batch)."""
    running = core.running
    b = len(running)
    if (
        b == 0 or core.waiting or core.aborted or max_steps < 1
        or not core.chunked_prefill or core.prefill_only_phase or core.hand_off
        or not core.policy.folds(running)
    ):
        return None
    ctx = 0
    for seq in running:
        if seq.computed < seq.target:
            return None
        ctx += seq.plen + seq.generated
    if b > min(core.prof.max_num_batched_tokens, core.policy.token_budget(core)):
        return None
    preempt_due(core)  # none are due while the policy folds (it made no claim: nobody waited)
    if len(running) != b:
        raise AssertionError("a policy that folds claimed victims")
    core.policy.step_batch(running)
    prof, bs, pool = core.prof, core.block_size, core.pool
    order = list(running)
    active = sorted(order, key=lambda q: q.max_tokens - q.generated)  # stable: running order on ties
    n = len(active)
    made: dict[Seq, EngineOutput] = {}
    durations: list[float] = []
    t = now
    first = j = last_batch = 0
    crossed = late = False
    one = straddle or late_before == float("-inf")  # the first step is taken, wherever it ends
    while first < n and j < max_steps:
        batch = n - first
        seg_end = min(active[first].max_tokens - active[first].generated, max_steps)
        j0, n0 = j, len(durations)
        # prof.step_ms(batch, batch, ctx + j·batch, 0.0) / 1000, its float operations in its
        # order (the fold's times must equal the steps' to the bit), hoisted out of the loop
        fixed = prof.overhead_ms + prof.linear(batch) + 0.0
        d0, d2 = prof.d0, prof.d2
        while j < seg_end:
            d = (fixed + (d0 + d2 * (ctx + j * batch))) / 1000.0
            if (j or not one) and t + d >= until:
                late = t + d < late_before  # delivered before late_before, whatever came before until
                crossed = t < until and (late or (straddle and first == 0))  # (none finished before it)
                if crossed:
                    t += d
                    durations.append(d)
                    j += 1
                break
            t += d
            durations.append(d)
            j += 1
        if j == j0:
            break
        if crossed and not late:  # the straddling step only where nothing is evicted: its events would come late
            need = 0
            for q in active:
                need += cdiv(q.computed + j, bs) - len(q.cached) - q.private
            if need > pool.free:
                crossed = False
                j -= 1
                durations.pop()  # (t is not used again: this segment is the fold's last)
        while True:  # blocks for this segment, without preemption
            need = 0
            for k in range(first, n):
                q = active[k]
                need += -(-(q.computed + j) // bs) - len(q.cached) - q.private  # cdiv, inlined
            if need <= pool.available:
                break
            j = j0 + (j - j0) // 2
            if j == j0:
                break
        del durations[n0 + j - j0 :]  # (t is not used again: a shortened segment is the last)
        if j == j0:
            break
        last_batch = batch
        for k in range(first, n):
            q = active[k]
            if -(-(q.computed + j) // bs) > len(q.cached) + q.private:  # (grow takes nothing otherwise)
                core.grow(q, q.computed + j)
        # requests finishing at the segment's end: out, and their blocks back
        while first < n and active[first].max_tokens - active[first].generated == j:
            q = active[first]
            made[q] = fold_output(q, j)
            ctx -= q.plen + q.generated - j
            core.finish(q)
            first += 1
        if crossed or j < seg_end:
            break
    if j == 0:  # not even one step fits its blocks: the ordinary step preempts
        return None
    for k in range(first, n):
        made[active[k]] = fold_output(active[k], j)
    outputs = [made[q] for q in order]
    core.last_step_s = durations[-1]
    core.last_tokens = last_batch
    core.slack.on_steps(durations, outputs, core.tpot_slo_ms_of, core.max_tokens_of)
    total = 0.0
    for d in durations:
        total += d
    return StepResult(total, outputs, sum(len(o.new_token_ids) for o in outputs), j, durations)


def advance(core: SimEngineCore, now: float = 0.0, until: float = float("inf"),
            max_steps: int = 1 << 30, straddle: bool = False) -> StepResult:
    """`fold` where the steps are pure decode steps, else one ordinary step."""
    return fold(core, now, until, max_steps, straddle) or core.step()


def fold_output(seq: Seq, k: int) -> EngineOutput:
    """k decode steps of a fold, applied: its k tokens, finished if they reach max_tokens."""
    pos = seq.generated
    seq.computed += k
    seq.generated = pos + k
    done = seq.generated >= seq.max_tokens
    return EngineOutput(seq.rid, filler_tokens(seq, pos, k), done, "length" if done else None, seq.cached_tokens)
