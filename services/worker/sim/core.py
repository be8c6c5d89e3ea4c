"""The simulated engine's core: vLLM V1-style continuous batching on a paged, prefix-cached
KV pool, one `step()` at a time, with the step's duration from a latency profile. Pure: no
clock, no I/O; the live worker sleeps each step's duration (÷ speed), the cluster simulator
advances a virtual clock by it (`advance` runs many steps at once where nothing can change).

One step, as vLLM's scheduler builds it (token budget = max_num_batched_tokens):
  0. the victims a policy's earlier claim marked (`due_victims`) are preempted.
  1. running requests first, in order (the policy's `step_batch`): a decoding one takes 1
     token (and a new block when it crosses a block boundary); one still prefilling takes
     its next chunk. If a block cannot be had, the one preemption rule's victim (lowest
     priority class, then latest arrival: scheduler.preemption_victim) is preempted — if it was scheduled this step,
     its tokens go back to the budget — by recompute (its blocks freed, it re-prefills
     prompt + generated tokens) or swap (its KV parked in the host tier), preemption.py.
  2. then, unless the phase is decode-only, the waiting line's head while budget, max_num_seqs
     and the policy's `admit` allow: it takes a reference on its longest cached prefix — GPU
     blocks, then host-tier blocks promoted back at the host link's cost — (at least one token
     is always computed) and the blocks of its first chunk, all or nothing (a waiting request
     holds no blocks, as in vLLM's allocate_slots). A swapped request instead gets its blocks
     back at the same cost and resumes where it stopped.
  After the step: full prompt blocks a chunk completed become cached (BlockStored); a
  request whose prefill completed emits its first token; each decode emits one token; a
  request reaching max_tokens finishes ("length") and releases its blocks. Step time =
  profile(all scheduled tokens, decodes and their context, each chunk's attention) + the
  host transfers the step made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenyard.services.worker.engine import EngineOutput, EngineStats
from tokenyard.services.worker.sim.kv_pool import BlockPool
from tokenyard.services.worker.sim.kv_tiers import HostTier
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.preemption import PreemptionMode, wants_swap
from tokenyard.services.worker.sim.scheduler import (
    SchedulingPolicy,
    VllmPolicy,
    allows_prefill,
    preemption_victim,
)
from tokenyard.services.worker.sim.slack import SlackClock, prefill_ms_per_token
from tokenyard.shared.schemas import AdmittedRequest, Phase
from tokenyard.shared.slo import ttft_target_s

_FILLER = b"the quick brown fox jumps over the lazy dog. "
_NF = len(_FILLER)
_FILLER_LONG = _FILLER * 64
_LONG = len(_FILLER_LONG) - _NF


def _deadline(req: AdmittedRequest) -> float:
    return req.deadline_s if req.deadline_s > 0 else req.arrival_s + ttft_target_s(req.priority)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "req", "rid", "order", "target", "computed", "generated", "cached", "private",
        "cached_tokens", "started", "running", "swapped", "_tok", "plen", "max_tokens",
    )

    def __init__(self, req: AdmittedRequest, order: int):
        self.req = req
        self.rid = req.request_id
        self.order = order
        """Arrival order in this engine (the waiting line's tiebreak; the latest is preempted first)."""
        self.target = req.prompt_len
        """Tokens to compute before decoding: the prompt, plus generated ones after a recompute."""
        self.computed = 0
        """Tokens whose KV is in (GPU, or the host tier while swapped)."""
        self.generated = 0
        self.cached: list[int] = []
        """Chain hashes this request holds a reference on (prefix hit, then committed blocks)."""
        self.private = 0
        self.cached_tokens = 0
        """Prompt tokens its first schedule found cached (vLLM's num_cached_tokens: a re-prefill
        after a preemption does not change it)."""
        self.started = False
        self.running = False
        self.swapped = 0
        """Blocks it parked in the host tier (swap preemption); 0 when not swapped."""
        self._tok = len(self.rid)
        self.plen = req.prompt_len
        self.max_tokens = req.max_tokens

    @property
    def blocks(self) -> int:
        return len(self.cached) + self.private

    def __repr__(self) -> str:
        return f"Seq({self.rid!r}, computed={self.computed}/{self.target}, generated={self.generated})"


_Seq = Seq


@dataclass
class StepResult:
    duration_s: float
    outputs: list[EngineOutput]
    """Tokens this step produced and requests it finished, delivered at now + duration."""
    scheduled_tokens: int = 0
    num_steps: int = 1
    """Engine steps this result covers (`advance` folds identical decode steps into one)."""
    step_durations: list[float] = field(default_factory=list)
    """With num_steps > 1: each step's duration; token k of every output came at the end of step k."""


class SimEngineCore:
    def __init__(
        self,
        prof: LatencyProfile,
        block_size: int = 16,
        num_blocks: int | None = None,
        *,
        host_blocks: int = 0,
        preemption_mode: PreemptionMode | str = PreemptionMode.RECOMPUTE,
        policy: SchedulingPolicy | None = None,
        tpot_slo_ms: float = 100.0,
    ):
        self.prof = prof
        self.block_size = block_size
        self.pool = BlockPool(num_blocks or prof.blocks(block_size), block_size)
        self.host = HostTier(host_blocks, block_size, self.pool.events)
        if host_blocks:
            self.pool.host = self.host
        self.preemption_mode = PreemptionMode(preemption_mode)
        self.policy: SchedulingPolicy = policy or VllmPolicy()
        self.phase: str = Phase.MIXED
        """Decode-only (Phase.DECODE) schedules no prefill (issue 8's phases)."""
        self.waiting = self.policy.new_waiting_line()
        self.running: list[Seq] = []
        self.seqs: dict[str, Seq] = {}
        self.last_step_s = 0.0
        self.prefix_hits = 0
        self.prefix_queries = 0
        self.host_hits = 0
        """Prompt tokens promoted from the host tier."""
        self.preemptions = 0
        self.swaps = 0
        self._order = 0
        self._aborted: list[EngineOutput] = []
        self._transfer_s = 0.0
        # EcoServe's inputs (issue 8, slack.py): saved TPOT slack on the engine's clock,
        # the last step's share of the token budget, the prefill cost per token.
        self.slack = SlackClock(tpot_slo_ms)
        self.prefill_ms_per_token = prefill_ms_per_token(prof)
        self.last_tokens = 0

    # ── requests ──
    def add(self, req: AdmittedRequest) -> None:
        if req.request_id in self.seqs:
            raise ValueError(f"request {req.request_id} is already in the engine")
        need = _cdiv(req.prompt_len + req.max_tokens, self.block_size)
        if need > self.pool.total:
            raise ValueError(f"request needs {need} KV blocks; the engine has {self.pool.total}")
        seq = Seq(req, self._order)
        self._order += 1
        self.seqs[req.request_id] = seq
        self.waiting.push(seq)

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.running:
            self.running.remove(seq)
            seq.running = False
        else:
            self.waiting.remove(seq)
        if seq.swapped:
            self.host.release_swap(seq.swapped)
            seq.swapped = 0
        self._free(seq)
        self._aborted.append(EngineOutput(request_id, [], True, "abort", seq.cached_tokens))
        return True

    def expire(self, now: float) -> list[str]:
        """With a policy that rejects past the deadline (SCORPIO's rejection path): take out
        every waiting request that never started and whose TTFT deadline (its own, else arrival
        + its class target) has passed before `now`; each ends at the next step with finish
        reason `deadline` and no token. Returns their ids."""
        if not self.policy.rejects_past_deadline or not self.waiting:
            return []
        late = [s for s in self.waiting if not s.started and s.generated == 0 and _deadline(s.req) < now]
        for seq in late:
            self.waiting.remove(seq)
            del self.seqs[seq.rid]
            self._aborted.append(EngineOutput(seq.rid, [], True, "deadline", 0))
        return [s.rid for s in late]

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._aborted)

    def set_phase(self, phase: str) -> None:
        self.phase = Phase(phase)

    # ── one step ──
    def step(self) -> StepResult:
        outputs, self._aborted = self._aborted, []
        self._transfer_s = 0.0
        prof = self.prof
        bs = self.block_size
        budget = prof.max_num_batched_tokens
        limit = getattr(self.policy, "token_budget", None)  # a policy may cap a step's tokens
        if limit is not None:
            budget = min(budget, limit(self))
        decodes: list[Seq] = []
        append_decode = decodes.append
        chunks: dict[Seq, int] = {}
        prefill_ok = allows_prefill(self.phase)
        preempted = self.preemptions
        decode_ctx = 0

        self._preempt_due()
        for seq in list(self.policy.step_batch(self.running)):
            if budget <= 0:
                break
            if not seq.running:  # preempted earlier in this step
                continue
            c = seq.computed
            if c >= seq.target:  # decoding: a new block when the last one is full
                if c % bs == 0 and not self._grow(seq, c + 1):
                    budget = self._preempt_for(seq, c + 1, budget, decodes, chunks)
                    if not seq.running:
                        continue
                append_decode(seq)
                decode_ctx += seq.plen + seq.generated
                budget -= 1
            elif prefill_ok:
                n = min(seq.target - c, budget)
                if (len(seq.cached) + seq.private) * bs < c + n and not self._grow(seq, c + n):
                    budget = self._preempt_for(seq, c + n, budget, decodes, chunks)
                    if not seq.running:
                        continue
                chunks[seq] = n
                budget -= n

        scheduled_decodes = len(decodes)
        if prefill_ok:
            self._admit_waiting(decodes, chunks, budget)

        # Timing and outputs.
        tokens = len(decodes)
        if preempted != self.preemptions or tokens != scheduled_decodes:  # victims left, swapped ones came back
            decode_ctx = 0
            for seq in decodes:
                decode_ctx += seq.plen + seq.generated
        attn = 0.0
        p0, p1, p2, p3 = prof.p0, prof.p1, prof.p2, prof.p3
        for seq, n in chunks.items():
            tokens += n
            attn += p0 + n * (p1 + p2 * n * 0.5 + p3 * seq.computed)
        dur = prof.step_ms(tokens, len(decodes), decode_ctx, attn) / 1000.0 + self._transfer_s
        self.last_step_s = dur
        for seq, n in chunks.items():
            self._advance_prefill(seq, n, outputs)
        append = outputs.append
        for seq in decodes:
            seq.computed += 1  # the previous token's KV
            pos = seq.generated
            seq.generated = pos + 1
            token = [_FILLER[(seq._tok + pos) % _NF]]
            if pos + 1 >= seq.max_tokens:
                append(EngineOutput(seq.rid, token, True, "length", seq.cached_tokens))
                self._finish(seq)
            else:
                append(EngineOutput(seq.rid, token, False, None, seq.cached_tokens))
        self.last_tokens = tokens
        self.slack.on_step(dur, outputs, self._tpot_slo_ms)
        return StepResult(dur, outputs, tokens)

    def _preempt_for(self, seq: Seq, end: int, budget: int, decodes: list[Seq], chunks: dict[Seq, int]) -> int:
        """Out of blocks: preempt the policy's victims until `seq` can hold `end` tokens, or
        it is the victim itself; a victim scheduled earlier in this step gives its tokens back.
        Returns the budget left."""
        while True:
            victim = preemption_victim(self.running)
            if victim in chunks:
                budget += chunks.pop(victim)
            elif victim is not seq and victim in decodes:
                decodes.remove(victim)
                budget += 1
            self._preempt(victim)
            if victim is seq or self._grow(seq, end):
                return budget

    def _preempt_due(self) -> None:
        for victim in self.policy.due_victims(self):
            if victim.running:
                self._preempt(victim)

    def _folds(self, running: list[Seq]) -> bool:
        """May identical steps be folded: the policy runs the whole batch every step. Asked
        without side effects where the policy can say so (`folds`, e.g. SCORPIO's credits)."""
        folds = getattr(self.policy, "folds", None)
        return folds(running) if folds is not None else self.policy.step_batch(running) is running

    def _tpot_slo_ms(self, request_id: str) -> float:
        seq = self.seqs.get(request_id)
        return seq.req.tpot_slo_ms if seq is not None else 0.0

    def advance(self, horizon_s: float = float("inf"), max_steps: int = 1 << 30) -> StepResult:
        """What `step()` called over and over would do while the time before each step is
        under `horizon_s` (at least one step), folded into one result where the steps are
        pure decode steps: everyone running decodes, nobody waits, no prefill, no abort
        pending, the policy runs the whole batch. The fold goes on through finishes (the
        batch shrinks; nobody is waiting to take the room) until the batch is empty, a block
        would run out, `max_steps`, or the horizon. Its result has one output per request with
        the tokens it made (token j at the end of the fold's step j), `num_steps` and each
        step's duration. Anything else: one ordinary step.

        Blocks are taken segment by segment (between two finishes) and a finishing request
        frees its blocks after its segment's allocations, as step by step: the same blocks
        are evicted, the same KV events come out."""
        self._preempt_due()
        running = self.running
        b = len(running)
        if (
            b == 0 or self.waiting or self._aborted or max_steps < 2
            or b > self.prof.max_num_batched_tokens
            or self.policy.step_batch(running) is not running
        ):
            return self.step()
        ctx = 0
        for seq in running:
            if seq.computed < seq.target:
                return self.step()
            ctx += seq.plen + seq.generated
        prof, bs, pool = self.prof, self.block_size, self.pool
        order = list(running)
        active = sorted(order, key=lambda q: q.max_tokens - q.generated)  # stable: running order on ties
        made: dict[Seq, EngineOutput] = {}
        durations: list[float] = []
        elapsed = 0.0
        first = j = 0
        while first < len(active) and j < max_steps:
            batch = len(active) - first
            seg_end = min(active[first].max_tokens - active[first].generated, max_steps)
            j0, n0 = j, len(durations)
            # prof.step_ms(batch, batch, ctx + j·batch, 0.0) / 1000, its float operations in its
            # order (the fold's times must equal the steps' to the bit), hoisted out of the loop
            fixed = prof.overhead_ms + prof.linear(batch) + 0.0
            d0, d2 = prof.d0, prof.d2
            while j < seg_end and not (j and elapsed >= horizon_s):
                d = (fixed + (d0 + d2 * (ctx + j * batch))) / 1000.0
                durations.append(d)
                elapsed += d
                j += 1
            if j == j0:
                break
            while True:  # blocks for this segment, without preemption
                need = 0
                for k in range(first, len(active)):
                    q = active[k]
                    need += _cdiv(q.computed + j, bs) - len(q.cached) - q.private
                if need <= pool.available:
                    break
                j = j0 + (j - j0) // 2
                if j == j0:
                    break
            del durations[n0 + j - j0 :]
            if j == j0:
                break
            for k in range(first, len(active)):
                self._grow(active[k], active[k].computed + j)
            # requests finishing at the segment's end: out, and their blocks back
            while first < len(active) and active[first].max_tokens - active[first].generated == j:
                q = active[first]
                made[q] = self._fold_output(q, j)
                ctx -= q.plen + q.generated - j
                self._finish(q)
                first += 1
            if j < seg_end:
                break
        if j == 0:  # not even one step fits its blocks: the ordinary step preempts
            return self.step()
        for k in range(first, len(active)):
            made[active[k]] = self._fold_output(active[k], j)
        outputs = [made[q] for q in order]
        self.last_step_s = durations[-1]
        self.last_tokens = len(active) - first or len(order)
        total = sum(durations)
        self.slack.on_step(total, outputs, self._tpot_slo_ms)
        return StepResult(total, outputs, sum(len(o.new_token_ids) for o in outputs), j, durations)

    def _fold_output(self, seq: Seq, k: int) -> EngineOutput:
        """k decode steps of a fold, applied: its k tokens, finished if they reach max_tokens."""
        pos = seq.generated
        seq.computed += k
        seq.generated = pos + k
        done = seq.generated >= seq.max_tokens
        start = (seq._tok + pos) % _NF
        if k <= _LONG:
            toks = list(_FILLER_LONG[start : start + k])
        else:
            toks = [_FILLER[(start + p) % _NF] for p in range(k)]
        return EngineOutput(seq.rid, toks, done, "length" if done else None, seq.cached_tokens)

    def _admit_waiting(self, decodes: list[Seq], chunks: dict[Seq, int], budget: int) -> None:
        bs = self.block_size
        pool = self.pool
        waiting = self.waiting
        max_seqs = self.prof.max_num_seqs
        while waiting and budget > 0 and len(self.running) < max_seqs:
            seq = waiting.peek()
            if not self.policy.admit(seq, self):
                break
            chain = seq.req.block_hashes
            if seq.swapped:
                n = 1 if seq.computed >= seq.target else min(seq.target - seq.computed, budget)
                gpu = pool.match_prefix(chain[: seq.computed // bs])
                need = _cdiv(seq.computed + n, bs) - gpu
                if need > pool.available - self._pinned(chain, gpu):
                    break
                pool.acquire(chain[:gpu])
                seq.cached = list(chain[:gpu])
                pool.allocate(need)
                seq.private = need
                self._transfer_s += self.prof.transfer_s(seq.computed - gpu * bs)
                self.host.release_swap(seq.swapped)
                seq.swapped = 0
            else:
                gpu, host = self._prefix_hit(seq)
                hit = gpu + host
                n = min(seq.target - hit * bs, budget)
                need = _cdiv(hit * bs + n, bs) - gpu
                if need > pool.available - self._pinned(chain, gpu):
                    break
                pool.acquire(chain[:gpu])
                seq.cached = list(chain[:gpu])
                promoted = chain[gpu:hit]
                if host:
                    self.host.pin(promoted)
                pool.allocate(need)
                seq.private = need
                if host:
                    self.host.unpin(promoted)
                    self._commit(seq, promoted)
                    self._transfer_s += self.prof.transfer_s(host * bs)
                    if not seq.started:
                        self.host_hits += host * bs
                seq.computed = hit * bs
                if not seq.started:  # a re-prefill after a preemption is not a new lookup
                    seq.cached_tokens = seq.computed
                    self.prefix_hits += seq.cached_tokens
                    self.prefix_queries += seq.req.prompt_len
            seq.started = True
            waiting.pop()
            seq.running = True
            self.running.append(seq)
            if seq.computed >= seq.target:  # a swapped decode resumes
                decodes.append(seq)
            else:
                chunks[seq] = n
            budget -= n

    # ── internals ──
    def _pinned(self, chain: list[int], gpu: int) -> int:
        """Evictable blocks of the prefix a request would take (they stop being available)."""
        ref = self.pool.ref
        return sum(1 for h in chain[:gpu] if ref[h] == 0) if gpu else 0

    def _prefix_hit(self, seq: Seq) -> tuple[int, int]:
        """Leading blocks of the request's chain cached now: (on the GPU, then in the host tier)."""
        chain = seq.req.block_hashes
        # vLLM always computes at least the last token, so a full hit gives back a block.
        cap = (seq.target - 1) // self.block_size
        gpu = min(self.pool.match_prefix(chain), cap)
        host = min(self.host.match(chain, gpu), cap - gpu) if self.host.lru else 0
        return gpu, host

    def _grow(self, seq: Seq, tokens: int) -> bool:
        extra = _cdiv(tokens, self.block_size) - len(seq.cached) - seq.private
        if extra <= 0:
            return True
        if not self.pool.allocate(extra):
            return False
        seq.private += extra
        return True

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)
        victim.running = False
        kv_tokens = victim.computed
        blocks = victim.blocks
        if wants_swap(self.preemption_mode, self.prof, kv_tokens) and self.host.reserve_swap(blocks):
            victim.swapped = blocks
            self._transfer_s += self.prof.transfer_s(kv_tokens)
            self.swaps += 1
            self._free(victim)
        else:
            self._free(victim)
            victim.target = victim.req.prompt_len + victim.generated
            victim.computed = 0
        self.waiting.push_front(victim)
        self.preemptions += 1

    def _free(self, seq: Seq) -> None:
        self.pool.release(seq.cached, seq.private)
        seq.cached, seq.private = [], 0

    def _commit(self, seq: Seq, new: list[int]) -> None:
        k = len(seq.cached)
        chain = seq.req.block_hashes
        bs = self.block_size
        self.pool.commit(new, chain[k - 1] if k else None, seq.req.prompt_token_ids[k * bs : (k + len(new)) * bs])
        seq.private -= len(new)
        seq.cached.extend(new)

    def _advance_prefill(self, seq: Seq, n: int, outputs: list[EngineOutput]) -> None:
        seq.computed += n
        chain = seq.req.block_hashes
        full = min(seq.computed // self.block_size, len(chain))
        if full > len(seq.cached):
            self._commit(seq, chain[len(seq.cached) : full])
        if seq.computed >= seq.target:
            self._emit(seq, outputs)

    def _emit(self, seq: Seq, outputs: list[EngineOutput]) -> None:
        pos = seq.generated
        seq.generated = pos + 1
        done = seq.generated >= seq.req.max_tokens
        outputs.append(
            EngineOutput(seq.rid, [_FILLER[(seq._tok + pos) % _NF]], done, "length" if done else None, seq.cached_tokens)
        )
        if done:
            self._finish(seq)

    def _finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.running = False
        del self.seqs[seq.rid]
        self._free(seq)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block no request holds, on both tiers (vLLM's
        reset_prefix_cache): BlockRemoved, or AllBlocksCleared when nothing stays cached."""
        self.pool.clear()
        self.host.clear()

    def stats(self) -> EngineStats:
        queued = 0
        for s in self.waiting:
            queued += s.target - s.computed
        for s in self.running:
            if s.computed < s.target:
                queued += s.target - s.computed
        host = self.host
        return EngineStats(
            running=len(self.running),
            waiting=len(self.waiting),
            queued_prefill_tokens=queued,
            kv_blocks_used=self.pool.used,
            kv_blocks_free=self.pool.available,
            block_size=self.block_size,
            step_time_ms=self.last_step_s * 1000.0,
            prefix_hits=self.prefix_hits,
            prefix_queries=self.prefix_queries,
            preemptions=self.preemptions,
            kv_host_blocks_used=host.capacity - host.free,
            kv_host_blocks_free=host.free,
            tpot_slack_ms=self.slack.min_slack_ms(),
            compute_util=self.last_tokens / self.prof.max_num_batched_tokens,
            prefill_ms_per_token=self.prefill_ms_per_token,
            prefill_ms_per_token2=self.prof.p3 / 2,  # Σ over the prompt of p3 × context ≈ p3 · L² / 2
            **(fields(self) if (fields := getattr(self.policy, "heartbeat_fields", None)) else {}),
        )
