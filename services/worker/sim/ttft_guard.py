"""The TTFT guard of SCORPIO (seed 003; DESIGN §3.5): a waiting request that can no longer get
its first token by its deadline is rejected as soon as that is known, not once the deadline
has passed — it would only take prefill time from the requests behind it that still can.

    rate        prompt tokens per second the engine prefills at its current step budget
                (the policy's `prefill_rate`: vLLM's full step, SCORPIO's TPOT-bounded one)
    work(w)     prompt tokens still to prefill ahead of w: the running requests' remaining
                prefill + the uncached prompts of the waiting requests served before w (the
                line's own order) that are not rejected themselves
    reject w    when it never started and now + (work(w) + its own uncached prompt) / rate
                > its TTFT deadline (shared.slo.request_deadline_s)

With nothing prefilling possible (rate 0) only requests already past their deadline go. The
prediction counts no new arrival ahead (a later, more urgent one would only make it later)
and no VBS hold (SCORPIO's admission may keep a request waiting longer). It does not always
err on keeping: SCORPIO's rate is the one its last step's budget was priced at, on the decodes
running then, and decodes only finish, so later steps may prefill faster than predicted and a
request rejected here could have made its deadline (a review found such a case: a 3,000-token
prompt beside 8 decodes of a 50 ms SLO, rejected at 1.57 s, first token at 1.84 s without the
guard against a 2.17 s deadline). A preempted request's remaining prefill counts from its
prompt only (a swapped decode owes none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.shared.slo import request_deadline_s

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.seq import Seq


def full_step_rate(core: SimEngineCore) -> float:
    """Prompt tokens per second of a step that fills max_num_batched_tokens beside the
    running decodes (vLLM's step: every decode every step)."""
    prof = core.prof
    decodes = [s for s in core.running if s.computed >= s.target]
    d = len(decodes)
    n = prof.max_num_batched_tokens - d
    if n <= 0:
        return 0.0
    ctx = sum(s.req.prompt_len + s.generated for s in decodes)
    return n / prof.step_ms(d + n, d, ctx, prof.chunk_attn_ms(n, 0)) * 1000.0


def uncached(core: SimEngineCore, seq: Seq) -> int:
    """Prompt tokens `seq` would still prefill: its target less its cached prefix on the GPU."""
    bs = core.block_size
    hit = min(core.pool.match_prefix(seq.req.block_hashes), (seq.target - 1) // bs) if seq.req.block_hashes else 0
    return seq.target - hit * bs


def unattainable(core: SimEngineCore, now: float) -> list[Seq]:
    """The waiting requests, never started, whose first token cannot come by their deadline."""
    rate = core.policy.prefill_rate(core)
    work = sum(s.target - s.computed for s in core.running if s.computed < s.target)
    late: list[Seq] = []
    for seq in core.waiting.ordered():
        if seq.started or seq.generated:  # preempted: it runs again, ahead of the rest
            work += max(0, seq.target - seq.computed)  # a swapped decode's computed passes its target
            continue
        own = uncached(core, seq) if rate > 0 else 0
        first_token = now + (work + own) / rate if rate > 0 else now
        if first_token > request_deadline_s(seq.req):
            late.append(seq)
        else:
            work += own
    return late
