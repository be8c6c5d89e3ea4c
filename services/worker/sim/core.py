"""The simulated engine's core: vLLM V1-style continuous batching on a paged, prefix-cached
KV pool, one `step()` at a time, with the step's duration from a latency profile. Pure: no
clock, no I/O; the live worker sleeps each step's duration (÷ speed), the cluster simulator
advances a virtual clock by it (`advance` runs many steps at once where nothing can change).

One step, as vLLM's scheduler builds it (token budget = max_num_batched_tokens):
  0. the victims a policy's earlier claim marked (`due_victims`) are preempted.
  1. running requests first, in order (the policy's `step_batch`): a decoding one takes 1
     token (and a new block when it crosses a block boundary); one still prefilling takes
     its next chunk, at most vLLM's long_prefill_token_threshold tokens while any other
     request is running or waiting (chunk_cap; 0, the default, is no cap; when set, a long
     prompt leaves room in each step for the requests behind it). If a block cannot be had,
     the one preemption rule's victim (lowest priority class, then latest arrival:
     scheduler.preemption_victim) is preempted — if it was scheduled this step, its tokens
     go back to the budget — by recompute (its blocks freed, it re-prefills prompt +
     generated tokens) or swap (its KV parked in the host tier), preemption.py.
  2. then, unless the phase is decode-only or step 1 preempted a request (vLLM V1 schedules
     no waiting request in a step that preempted: `if not preempted_reqs`), the waiting line's
     head while budget, max_num_seqs and the policy's `admit` allow: it takes a reference on
     its longest cached prefix — GPU blocks, then host-tier blocks promoted back at the host
     link's cost — (at least one token is always computed) and the blocks of its first chunk
     (capped as in 1), all or nothing (a waiting request holds no blocks, as in vLLM's
     allocate_slots). A swapped request instead gets its blocks back at the same cost and
     resumes where it stopped.
  After the step: full prompt blocks a chunk completed become cached (BlockStored); a
  request whose prefill completed emits its first token; each decode emits one token; a
  request reaching max_tokens finishes ("length") and releases its blocks. Step time =
  profile(all scheduled tokens, decodes and their context, each chunk's attention) + the
  host transfers the step made.

The parts, one module each: seq.py (a request's state, a step's result, output tokens),
scheduler.py (the policy seam and the preemption rule), preemption.py (how a victim gives its
blocks back), admit.py (step 2), phases.py (what a step may schedule), fold.py (`advance`),
engine_stats.py (what the heartbeat reports), kv_pool.py / kv_tiers.py (the blocks).
"""

from __future__ import annotations

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim import fold
from tokenyard.services.worker.sim.admit import admit_waiting
from tokenyard.services.worker.sim.engine_stats import engine_stats
from tokenyard.services.worker.sim.kv_pool import BlockPool
from tokenyard.services.worker.sim.kv_tiers import HostTier
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.services.worker.sim.phases import step_shape
from tokenyard.services.worker.sim.preemption import PreemptionMode, preempt_due, preempt_for
from tokenyard.services.worker.sim.scheduler import SchedulingPolicy, VllmPolicy, allows_prefill
from tokenyard.services.worker.sim.seq import FILLER, Seq, StepResult, cdiv, filler_token
from tokenyard.services.worker.sim.slack import SlackClock, prefill_ms_per_token
from tokenyard.services.worker.sim.ttft_guard import unattainable
from tokenyard.shared.schemas import AdmittedRequest, EngineStats, Phase
from tokenyard.shared.slo import DEFAULT_TPOT_SLO_MS

INF = float("inf")
__all__ = ["FILLER", "Seq", "SimEngineCore", "StepResult"]


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
        tpot_slo_ms: float = DEFAULT_TPOT_SLO_MS,
        chunked_prefill: bool = True,
        prefill_only_phase: bool = False,
        hand_off: bool = False,
        max_model_len: int = 131_072,
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
        self.step_overhead_s = 0.0
        """Time a step costs beyond its modelled duration, as the live engine's loop measures it
        between two deliveries (the median of the last steps', overhead.py; the simulator's
        virtual clock has none): SCORPIO's TPOT guard keeps it out of its SLO bound, the TTFT
        guard adds it to every step."""
        self.prefix_hits = 0
        self.prefix_queries = 0
        self.host_hits = 0
        """Prompt tokens promoted from the host tier."""
        self.preemptions = 0
        self.swaps = 0
        self._order = 0
        self.aborted: list[EngineOutput] = []
        """Aborted and expired requests, each ended by the next step's outputs."""
        self.step_transfer_s = 0.0
        """Host-link transfers (swaps, promotions) the step being built makes; added to its time."""
        # EcoServe's inputs (issue 8, slack.py): saved TPOT slack on the engine's clock,
        # the last step's share of the token budget, the prefill cost per token.
        self.slack = SlackClock(tpot_slo_ms)
        self.prefill_ms_per_token = prefill_ms_per_token(prof)
        self.last_tokens = 0
        # Issue 13's step shapes (phases.py says which step runs what):
        self.chunked_prefill = chunked_prefill
        """False: vLLM without chunked prefill — a step prefills whole prompts only, or decodes."""
        self.prefill_only_phase = prefill_only_phase
        """True: the prefill phase prefills only (seed 002 §2.2.1); decodes wait for the
        decode phase, or a step with no prefill to do."""
        self.hand_off = hand_off
        """True: a spatial P/D prefill instance — a request leaves after its first token, its
        KV sent to a decode instance (`handed_off`)."""
        self.max_model_len = max_model_len
        if prof.long_prefill_token_threshold < 0:
            raise ValueError("--long-prefill-token-threshold must be ≥ 0 (0: no cap)")
        self.prefill_cap = prof.long_prefill_token_threshold
        """vLLM's long_prefill_token_threshold (chunk_cap says when it applies); 0: none."""
        self.handed_off: list[tuple[AdmittedRequest, int]] = []
        """(request, its num_cached_tokens) of each hand-off since the caller last drained it."""
        self._stats: EngineStats | None = None
        """`stats()` since the engine last changed (every method that changes it drops it): an
        idle engine's keep-alive heartbeats and a tick's samples ask again for the same numbers."""

    # ── requests ──
    def add(self, req: AdmittedRequest) -> None:
        if req.request_id in self.seqs:
            raise ValueError(f"request {req.request_id} is already in the engine")
        need = cdiv(req.prompt_len + req.max_tokens, self.block_size)
        if need > self.pool.total:
            raise ValueError(f"request needs {need} KV blocks; the engine has {self.pool.total}")
        self._stats = None
        seq = Seq(req, self._order)
        self._order += 1
        self.seqs[req.request_id] = seq
        self.waiting.push(seq)

    def add_prefilled(self, req: AdmittedRequest, cached_tokens: int = 0) -> None:
        """Spatial P/D's decode leg: `req`'s prompt was prefilled elsewhere and its first token
        sent; its KV (prompt + that token) arrives here and it decodes the rest. It waits in
        line for the blocks like any request; `cached_tokens` is the prefill side's prefix hit."""
        if req.max_tokens <= 1:
            raise ValueError(f"request {req.request_id} was done at its first token")
        self.add(req)
        seq = self.seqs[req.request_id]
        seq.remote = True
        seq.started = True
        seq.computed = seq.target = req.prompt_len
        seq.generated = 1
        seq.cached_tokens = cached_tokens

    def _hand_off(self, outputs: list[EngineOutput]) -> None:
        """Spatial P/D's prefill instance: each request that produced its first token (and is
        not done) leaves with its KV; its full prompt blocks stay cached here."""
        for out in outputs:
            seq = self.seqs.get(out.request_id)
            if seq is None or out.finished or not seq.running or seq.generated != 1 or seq.computed < seq.target:
                continue
            self.finish(seq)
            self.slack.forget(seq.rid)
            self.handed_off.append((seq.req, seq.cached_tokens))

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self._stats = None
        if seq.running:
            self.running.remove(seq)
            seq.running = False
        else:
            self.waiting.remove(seq)
        if seq.swapped:
            self.host.release_swap(seq.swapped)
            seq.swapped = 0
        self.free(seq)
        self.aborted.append(EngineOutput(request_id, [], True, "abort", seq.cached_tokens))
        return True

    def expire(self, now: float) -> list[str]:
        """With a policy that rejects what it cannot serve in time (SCORPIO's rejection path):
        take out every waiting request that never started and whose first token can no longer
        come by its TTFT deadline (its own, else arrival + its class target) — predicted from
        the work ahead of it at the best the policy's steps can do (ttft_guard.py), so no later than
        once the deadline has passed; each ends at the next step with finish reason `deadline`
        and no token. Returns their ids."""
        if not self.policy.rejects_past_deadline or not self.waiting:
            return []
        late = unattainable(self, now)
        if late:
            self._stats = None
        for seq in late:
            self.waiting.remove(seq)
            del self.seqs[seq.rid]
            self.aborted.append(EngineOutput(seq.rid, [], True, "deadline", 0))
        return [s.rid for s in late]

    def has_work(self) -> bool:
        # every request waiting or running is in `seqs` (a dict's truth is cheaper than the line's)
        return bool(self.seqs or self.aborted)

    def set_phase(self, phase: str) -> None:
        self._stats = None
        self.phase = Phase(phase)

    # ── one step ──
    def step(self) -> StepResult:
        self._stats = None
        outputs, self.aborted = self.aborted, []
        self.step_transfer_s = 0.0
        prof = self.prof
        bs = self.block_size
        budget = min(prof.max_num_batched_tokens, self.policy.token_budget(self))  # a policy may cap it
        decodes: list[Seq] = []
        append_decode = decodes.append
        chunks: dict[Seq, int] = {}
        prefill_ok, decode_ok, whole, budget = step_shape(self, allows_prefill(self.phase), budget)
        cap = self.chunk_cap(whole)
        preempted = self.preemptions
        decode_ctx = 0

        preempt_due(self)
        claimed = self.preemptions  # a policy's claims make room for the waiting: they do not stop step 2
        for seq in list(self.policy.step_batch(self.running)):
            if budget <= 0:
                break
            if not seq.running:  # preempted earlier in this step
                continue
            c = seq.computed
            if c >= seq.target:  # decoding: a new block when the last one is full
                if not decode_ok:
                    continue
                if c % bs == 0 and not self.grow(seq, c + 1):
                    budget = preempt_for(self, seq, c + 1, budget, decodes, chunks)
                    if not seq.running:
                        continue
                append_decode(seq)
                decode_ctx += seq.plen + seq.generated
                budget -= 1
            elif prefill_ok:
                n = min(seq.target - c, cap, budget)
                if (len(seq.cached) + seq.private) * bs < c + n and not self.grow(seq, c + n):
                    budget = preempt_for(self, seq, c + n, budget, decodes, chunks)
                    if not seq.running:
                        continue
                chunks[seq] = n
                budget -= n

        scheduled_decodes = len(decodes)
        if prefill_ok and self.preemptions == claimed:  # vLLM: no new request joins a step that preempted
            admit_waiting(self, decodes, chunks, budget, whole, cap)

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
        dur = prof.step_ms(tokens, len(decodes), decode_ctx, attn) / 1000.0 + self.step_transfer_s
        self.last_step_s = dur
        for seq, n in chunks.items():
            self.advance_prefill(seq, n, outputs)
        if self.hand_off:
            self._hand_off(outputs)
        append = outputs.append
        for seq in decodes:
            seq.computed += 1  # the previous token's KV
            pos = seq.generated
            seq.generated = pos + 1
            token = [filler_token(seq, pos)]
            if pos + 1 >= seq.max_tokens:
                append(EngineOutput(seq.rid, token, True, "length", seq.cached_tokens))
                self.finish(seq)
            else:
                append(EngineOutput(seq.rid, token, False, None, seq.cached_tokens))
        self.last_tokens = tokens
        self.slack.on_step(dur, outputs, self.tpot_slo_ms_of, self.max_tokens_of)
        return StepResult(dur, outputs, tokens)

    def chunk_cap(self, whole: bool) -> int | float:
        """The most prompt tokens one request may prefill this step: vLLM's
        long_prefill_token_threshold (the profile's) while another request
        is running or waiting — vLLM counts both — else no cap; none either where prompts go
        whole (no chunked prefill) or the threshold is 0."""
        t = self.prefill_cap
        if whole or not t or len(self.running) + len(self.waiting) <= 1:
            return INF
        return t

    def max_tokens_of(self, request_id: str) -> int:
        seq = self.seqs.get(request_id)
        return seq.max_tokens if seq is not None else 0

    def tpot_slo_ms_of(self, request_id: str) -> float:
        seq = self.seqs.get(request_id)
        return seq.req.tpot_slo_ms if seq is not None else 0.0

    def fold(self, now: float = 0.0, until: float = float("inf"), max_steps: int = 1 << 30,
             straddle: bool = False, late_before: float = float("-inf")) -> StepResult | None:
        """The next pure decode steps that end before `until` (with `straddle`, and the one
        across it where nothing is delivered before `until`; with `late_before`, the one
        across it where it ends before that), computed as one (fold.py); None where the next
        step is not one, the engine unchanged (its stats object too: a repeat heartbeat stays one)."""
        res = fold.fold(self, now, until, max_steps, straddle, late_before)
        if res is not None:
            self._stats = None
        return res

    def advance(self, now: float = 0.0, until: float = float("inf"), max_steps: int = 1 << 30,
                straddle: bool = False) -> StepResult:
        """`fold`, else one ordinary step."""
        self._stats = None
        return fold.advance(self, now, until, max_steps, straddle)

    # ── internals ──
    def grow(self, seq: Seq, tokens: int) -> bool:
        extra = cdiv(tokens, self.block_size) - len(seq.cached) - seq.private
        if extra <= 0:
            return True
        if not self.pool.allocate(extra):
            return False
        seq.private += extra
        return True

    def free(self, seq: Seq) -> None:
        self.pool.release(seq.cached, seq.private)
        seq.cached, seq.private = [], 0

    def commit(self, seq: Seq, new: list[int]) -> None:
        k = len(seq.cached)
        chain = seq.req.block_hashes
        bs = self.block_size
        self.pool.commit(new, chain[k - 1] if k else None, seq.req.prompt_token_ids[k * bs : (k + len(new)) * bs])
        seq.private -= len(new)
        seq.cached.extend(new)

    def advance_prefill(self, seq: Seq, n: int, outputs: list[EngineOutput]) -> None:
        """A step computed `n` more of `seq`'s prompt tokens (one chunk; public: tests note each)."""
        seq.computed += n
        chain = seq.req.block_hashes
        full = min(seq.computed // self.block_size, len(chain))
        if full > len(seq.cached):
            self.commit(seq, chain[len(seq.cached) : full])
        if seq.computed >= seq.target:
            self._emit(seq, outputs)

    def _emit(self, seq: Seq, outputs: list[EngineOutput]) -> None:
        pos = seq.generated
        seq.generated = pos + 1
        done = seq.generated >= seq.req.max_tokens
        outputs.append(EngineOutput(seq.rid, [filler_token(seq, pos)], done, "length" if done else None, seq.cached_tokens))
        if done:
            self.finish(seq)

    def finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.running = False
        del self.seqs[seq.rid]
        self.free(seq)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block no request holds, on both tiers (vLLM's
        reset_prefix_cache): BlockRemoved, or AllBlocksCleared when nothing stays cached."""
        self._stats = None
        self.pool.clear()
        self.host.clear()

    def stats(self) -> EngineStats:
        if self._stats is None:
            self._stats = engine_stats(self)
        return self._stats
