"""Admission inside one step of the simulated engine: the waiting line's head joins the
running set while the step's budget, max_num_seqs and the policy's `admit` allow, all or
nothing (a waiting request holds no blocks, as in vLLM's allocate_slots):

    fresh      prefix hit = its longest cached prefix, GPU blocks (a reference taken), then
               host-tier blocks promoted back at the host link's cost; capped so that at least
               one token is computed; first chunk n = min(target − hit, cap, budget) (whole
               prompts only when `whole`), blocks needed = ⌈(hit + n) / B⌉ − gpu hit
    swapped    its blocks back (its GPU-cached prefix re-referenced, the rest copied in at the
               host link's cost); a decode resumes with 1 token, a prefill with its next chunk
    remote     spatial P/D's decode leg: fresh blocks for prompt + first token, then it decodes
A request that does not fit stops admission for this step (head-of-line, as vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.services.worker.sim.seq import Seq, cdiv

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore


def admit_waiting(core: SimEngineCore, decodes: list[Seq], chunks: dict[Seq, int], budget: int,
                  whole: bool = False, cap: int | float = float("inf")) -> None:
    """`cap`: the most prompt tokens one request may prefill this step (SimEngineCore.chunk_cap)."""
    bs = core.block_size
    pool = core.pool
    waiting = core.waiting
    max_seqs = core.prof.max_num_seqs
    while waiting and budget > 0 and len(core.running) < max_seqs:
        seq = waiting.peek()
        if not core.policy.admit(seq, core):
            break
        chain = seq.req.block_hashes
        if seq.remote:  # spatial P/D: its KV lands in fresh blocks, then it decodes
            n = 1
            need = cdiv(seq.computed + 1, bs)
            if need > pool.available:
                break
            pool.allocate(need)
            seq.private = need
            seq.remote = False
        elif seq.swapped:
            n = 1 if seq.computed >= seq.target else min(seq.target - seq.computed, cap, budget)
            gpu = pool.match_prefix(chain[: seq.computed // bs])
            need = cdiv(seq.computed + n, bs) - gpu
            if need > pool.available - pinned(core, chain, gpu):
                break
            pool.acquire(chain[:gpu])
            seq.cached = list(chain[:gpu])
            pool.allocate(need)
            seq.private = need
            core.step_transfer_s += core.prof.transfer_s(seq.computed - gpu * bs)
            core.host.release_swap(seq.swapped)
            seq.swapped = 0
        else:
            gpu, host = prefix_hit(core, seq)
            hit = gpu + host
            n = min(seq.target - hit * bs, cap, budget)
            if whole and n < seq.target - hit * bs:
                break  # no chunking: the whole prompt in this step, or wait for the next
            need = cdiv(hit * bs + n, bs) - gpu
            if need > pool.available - pinned(core, chain, gpu):
                break
            pool.acquire(chain[:gpu])
            seq.cached = list(chain[:gpu])
            promoted = chain[gpu:hit]
            if host:
                core.host.pin(promoted)
            pool.allocate(need)
            seq.private = need
            if host:
                core.host.unpin(promoted)
                core.commit(seq, promoted)
                core.step_transfer_s += core.prof.transfer_s(host * bs)
                if not seq.started:
                    core.host_hits += host * bs
            seq.computed = hit * bs
            if not seq.started:  # a re-prefill after a preemption is not a new lookup
                seq.cached_tokens = seq.computed
                core.prefix_hits += seq.cached_tokens
                core.prefix_queries += seq.req.prompt_len
        seq.started = True
        waiting.pop()
        seq.running = True
        core.running.append(seq)
        if seq.computed >= seq.target:  # a swapped decode resumes
            decodes.append(seq)
        else:
            chunks[seq] = n
        budget -= n


def pinned(core: SimEngineCore, chain: list[int], gpu: int) -> int:
    """Evictable blocks of the prefix a request would take (they stop being available)."""
    ref = core.pool.ref
    return sum(1 for h in chain[:gpu] if ref[h] == 0) if gpu else 0


def prefix_hit(core: SimEngineCore, seq: Seq) -> tuple[int, int]:
    """Leading blocks of the request's chain cached now: (on the GPU, then in the host tier)."""
    chain = seq.req.block_hashes
    # vLLM always computes at least the last token, so a full hit gives back a block.
    cap = (seq.target - 1) // core.block_size
    gpu = min(core.pool.match_prefix(chain), cap)
    host = min(core.host.match(chain, gpu), cap - gpu) if core.host.lru else 0
    return gpu, host
