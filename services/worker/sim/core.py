"""The simulated engine's core: vLLM V1-style continuous batching on a paged, prefix-cached
KV pool, one `step(now)` at a time, with the step's duration from a latency profile. Pure:
no clock, no I/O; the live worker sleeps each step's duration (÷ speed), the cluster
simulator advances a virtual clock by it.

One step, as vLLM's scheduler builds it (token budget = max_num_batched_tokens):
  1. running requests first, in order: a decoding one takes 1 token (and a new block when
     it crosses a block boundary); one still prefilling takes its next chunk;
     if a block cannot be had, the newest running request is preempted (recompute: its
     blocks are freed and it goes back to the head of the waiting line, to re-prefill
     prompt + generated tokens);
  2. then waiting requests, FCFS, while budget and max_num_seqs allow: a request takes a
     reference on its longest cached prefix (at least one token is always computed) and the
     blocks of its first chunk, both or neither (a waiting request holds no blocks, as in
     vLLM's allocate_slots: one stuck at the head must not pin blocks the running need).
  After the step: full prompt blocks a chunk completed become cached (BlockStored); a
  request whose prefill completed emits its first token; each decode emits one token; a
  request reaching max_tokens finishes ("length") and releases its blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.worker.engine import EngineOutput, EngineStats
from services.worker.sim.kv_pool import BlockPool
from services.worker.sim.latency import LatencyProfile
from shared.schemas import AdmittedRequest

_FILLER = b"the quick brown fox jumps over the lazy dog. "


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class _Seq:
    req: AdmittedRequest
    target: int
    """Tokens to compute before decoding: the prompt, plus generated ones after a preemption."""
    computed: int = 0
    generated: int = 0
    cached: list[int] = field(default_factory=list)
    """Chain hashes this request holds a reference on (prefix hit, then committed blocks)."""
    private: int = 0
    cached_tokens: int = 0
    """Prompt tokens its first schedule found cached (vLLM's num_cached_tokens: a re-prefill
    after a preemption does not change it)."""
    started: bool = False
    """Scheduled at least once."""

    @property
    def rid(self) -> str:
        return self.req.request_id

    @property
    def blocks(self) -> int:
        return len(self.cached) + self.private


@dataclass
class StepResult:
    duration_s: float
    outputs: list[EngineOutput]
    """Tokens this step produced and requests it finished, delivered at now + duration."""
    scheduled_tokens: int = 0


class SimEngineCore:
    def __init__(self, prof: LatencyProfile, block_size: int = 16, num_blocks: int | None = None):
        self.prof = prof
        self.block_size = block_size
        self.pool = BlockPool(num_blocks or prof.num_gpu_blocks, block_size)
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.seqs: dict[str, _Seq] = {}
        self.last_step_s = 0.0
        self.prefix_hits = 0
        self.prefix_queries = 0
        self.preemptions = 0
        self._aborted: list[EngineOutput] = []

    # ── requests ──
    def add(self, req: AdmittedRequest) -> None:
        if req.request_id in self.seqs:
            raise ValueError(f"request {req.request_id} is already in the engine")
        need = _cdiv(req.prompt_len + req.max_tokens, self.block_size)
        if need > self.pool.total:
            raise ValueError(f"request needs {need} KV blocks; the engine has {self.pool.total}")
        seq = _Seq(req, target=req.prompt_len)
        self.seqs[req.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._free(seq)
        self._aborted.append(EngineOutput(request_id, [], True, "abort", seq.cached_tokens))
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._aborted)

    # ── one step ──
    def step(self) -> StepResult:
        outputs, self._aborted = self._aborted, []
        budget = self.prof.max_num_batched_tokens
        chunks: list[tuple[_Seq, int]] = []
        decodes: list[_Seq] = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            decoding = seq.computed >= seq.target
            n = 1 if decoding else min(seq.target - seq.computed, budget)
            if not self._grow(seq, seq.computed + n):
                # Out of blocks: preempt the newest request not yet scheduled this step,
                # or, if there is none, this one.
                if len(self.running) - 1 > i:
                    self._preempt(self.running[-1])
                    continue
                self._preempt(seq)
                break
            if decoding:
                decodes.append(seq)
            else:
                chunks.append((seq, n))
            budget -= n
            i += 1

        while self.waiting and budget > 0 and len(self.running) < self.prof.max_num_seqs:
            seq = self.waiting[0]
            hit = self._prefix_hit(seq)
            n = min(seq.target - hit * self.block_size, budget)
            need = _cdiv(hit * self.block_size + n, self.block_size) - hit
            pinned = sum(1 for h in seq.req.block_hashes[:hit] if self.pool.ref[h] == 0)
            if need > self.pool.available - pinned:
                break
            self._match_prefix(seq, hit)
            self._grow(seq, seq.computed + n)  # cannot fail: checked above
            self.waiting.popleft()
            self.running.append(seq)
            chunks.append((seq, n))
            budget -= n

        dur = self.prof.step_s(
            len(decodes),
            sum(s.req.prompt_len + s.generated for s in decodes),
            [(n, s.computed) for s, n in chunks],
        )
        self.last_step_s = dur
        for seq, n in chunks:
            self._advance_prefill(seq, n, outputs)
        for seq in decodes:
            self._emit(seq, outputs, decoded=True)
        return StepResult(dur, outputs, self.prof.max_num_batched_tokens - budget)

    # ── internals ──
    def _prefix_hit(self, seq: _Seq) -> int:
        """Leading blocks of the request's chain that are cached now."""
        hit = self.pool.match_prefix(seq.req.block_hashes)
        # vLLM always computes at least the last prompt token, so a full hit gives back a block.
        return min(hit, (seq.target - 1) // self.block_size)

    def _match_prefix(self, seq: _Seq, hit: int) -> None:
        chain = seq.req.block_hashes
        self.pool.acquire(chain[:hit])
        seq.cached = list(chain[:hit])
        seq.computed = hit * self.block_size
        if not seq.started:  # a re-prefill after a preemption is not a new lookup
            seq.started = True
            seq.cached_tokens = seq.computed
            self.prefix_hits += seq.cached_tokens
            self.prefix_queries += seq.req.prompt_len

    def _grow(self, seq: _Seq, tokens: int) -> bool:
        extra = _cdiv(tokens, self.block_size) - seq.blocks
        if extra <= 0:
            return True
        if not self.pool.allocate(extra):
            return False
        seq.private += extra
        return True

    def _preempt(self, victim: _Seq) -> None:
        """Recompute preemption: free its blocks, requeue it at the head to re-prefill."""
        self.running.remove(victim)
        self._free(victim)
        victim.target = victim.req.prompt_len + victim.generated
        victim.computed = 0
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _free(self, seq: _Seq) -> None:
        self.pool.release(seq.cached, seq.private)
        seq.cached, seq.private = [], 0

    def _advance_prefill(self, seq: _Seq, n: int, outputs: list[EngineOutput]) -> None:
        seq.computed += n
        chain = seq.req.block_hashes
        full = min(seq.computed // self.block_size, len(chain))
        if full > len(seq.cached):
            new = chain[len(seq.cached) : full]
            parent = chain[len(seq.cached) - 1] if seq.cached else None
            bs = self.block_size
            tokens = seq.req.prompt_token_ids[len(seq.cached) * bs : full * bs]
            self.pool.commit(new, parent, tokens)
            seq.private -= len(new)
            seq.cached.extend(new)
        if seq.computed >= seq.target:
            self._emit(seq, outputs, decoded=False)

    def _emit(self, seq: _Seq, outputs: list[EngineOutput], decoded: bool) -> None:
        pos = seq.generated
        seq.generated += 1
        if decoded:
            # A decode step computed the previous token's KV. A prefill (also the re-prefill
            # of prompt + generated tokens after a preemption) already counted what it computed.
            seq.computed += 1
        token = _FILLER[(len(seq.rid) + pos) % len(_FILLER)]
        done = seq.generated >= seq.req.max_tokens
        outputs.append(EngineOutput(seq.rid, [token], done, "length" if done else None, seq.cached_tokens))
        if done:
            self.running.remove(seq)
            del self.seqs[seq.rid]
            self._free(seq)

    def stats(self) -> EngineStats:
        queued = sum(s.target - s.computed for s in self.waiting)
        queued += sum(s.target - s.computed for s in self.running if s.computed < s.target)
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
        )
