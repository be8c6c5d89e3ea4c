"""What the simulated engine reports (EngineStats, the heartbeat's engine part):

    queued_prefill_tokens  Σ (target − computed) over the waiting and the running still prefilling
    queued_prefill_ahead   per class c: the running prefills' part, plus the waiting of class ≤ c
                           (what a new class-c request waits behind in vLLM's priority order;
                           a policy whose line is not class-first, `class_ordered` False: the
                           whole backlog for every class)
    tpot_slack_ms          the tightest decode's saved slack (slack.py), paced by a decode step
                           of the batch decoding now: step_ms(n, n, Σ context, 0); None under a
                           policy that guards TPOT itself (SCORPIO: scheduler.guards_tpot)
    compute_util           tokens of the last step ÷ the step token budget; 0 when idle
    prefill_ms_per_token   one full-budget fresh chunk's step time ÷ the budget
    prefill_ms_per_token2  p3 / 2 (Σ over a prompt of p3 × context ≈ p3 · L² / 2)
    decode_ms_per_ctx_token  d2 (a decode's attention per token of its context)
plus the counters (prefix hits and queries, preemptions), the KV pool's and the host tier's
used and free blocks, and whatever the scheduling policy adds (`heartbeat_fields`).
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.admit import prefix_hit
from tokenyard.shared.schemas import EngineStats
from tokenyard.shared.slo import NUM_CLASSES, klass

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore


def engine_stats(core: SimEngineCore) -> EngineStats:
    by_class = [0] * NUM_CLASSES
    net = [0] * NUM_CLASSES  # the same less each one's prefix cached now (admit.prefix_hit)
    if core.waiting:  # (a heap's live entries: not walked when it is empty, as mostly)
        bs = core.block_size
        for s in core.waiting:
            c = klass(s.req.priority)
            by_class[c] += s.target - s.computed
            if s.swapped or s.remote:  # its KV comes back (or in) whole: no lookup
                net[c] += s.target - s.computed
            else:
                gpu, host = prefix_hit(core, s)
                net[c] += s.target - max(s.computed, (gpu + host) * bs)
    decoding = ctx = running = 0
    for s in core.running:
        if s.computed < s.target:
            running += s.target - s.computed
        else:
            decoding += 1
            ctx += s.plen + s.generated
    queued = running + sum(by_class)
    # a line in another order (SCORPIO's, by deadline) puts no class first: each waits behind all
    ahead = list(accumulate(by_class, initial=running))[1:] if core.policy.class_ordered else [queued] * NUM_CLASSES
    ahead_net = (list(accumulate(net, initial=running))[1:] if core.policy.class_ordered
                 else [running + sum(net)] * NUM_CLASSES)
    assert ahead[-1] == queued, "the lowest class waits behind the whole backlog"
    # the pace of the decodes' tokens still to come: a decode step of the batch now
    decode_ms = core.prof.step_ms(decoding, decoding, ctx, 0.0)
    host_free = core.host.free
    return EngineStats(
        running=len(core.running),
        waiting=len(core.waiting),
        queued_prefill_tokens=queued,
        queued_prefill_ahead=ahead,
        queued_prefill_ahead_net=ahead_net,
        kv_blocks_used=core.pool.used,
        kv_blocks_free=core.pool.available,
        block_size=core.block_size,
        step_time_ms=core.last_step_s * 1000.0,
        prefix_hits=core.prefix_hits,
        prefix_queries=core.prefix_queries,
        preemptions=core.preemptions,
        kv_host_blocks_used=core.host.capacity - host_free,
        kv_host_blocks_free=host_free,
        tpot_slack_ms=None if core.policy.guards_tpot else core.slack.min_slack_ms(decode_ms),
        # an idle engine computes nothing, whatever its last step was
        compute_util=core.last_tokens / core.prof.max_num_batched_tokens if core.has_work() else 0.0,
        prefill_ms_per_token=core.prefill_ms_per_token,
        prefill_ms_per_token2=core.prof.p3 / 2,  # Σ over the prompt of p3 × context ≈ p3 · L² / 2
        decode_ms_per_ctx_token=core.prof.d2,
        **core.policy.heartbeat_fields(core),
    )
