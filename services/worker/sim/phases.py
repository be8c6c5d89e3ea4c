"""What one step of the simulated engine may schedule — its shape — beside the phase rules
(scheduler.allows_prefill). Three engine options, each a published system's step:

  chunked_prefill (default, vLLM V1 / Sarathi): decodes first, then prefill chunks under the
      token budget, mixed in one step.
  chunked_prefill=False (vLLM as seed 002 ran it, V0's default): a step either prefills whole
      prompts — when a waiting prompt's blocks are free, prefill first — under a budget of
      max(max_num_batched_tokens, max_model_len) (the head always fits), or decodes; never both.
  prefill_only_phase (EcoServe as seed 002 §2.2.1 describes it): in the prefill phase a step
      prefills only, its decodes stalled — paid for by the slack they saved in the decode
      phase; a step with no prefill to do runs the decodes (the GPU does not idle).

step_shape(core, prefill_allowed, budget) → (prefill_ok, decode_ok, whole, budget):
  prefill_ok  running prompts' chunks and the waiting line may be scheduled
  decode_ok   decoding requests may be scheduled
  whole       a prompt is admitted only whole (no chunk)
  budget      this step's token budget
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.shared.schemas import Phase

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def has_prefill_work(core: SimEngineCore) -> bool:
    """A prompt (or a recompute) is waiting or part-way through its prefill."""
    if core.waiting:
        return True
    return any(seq.computed < seq.target for seq in core.running)


def step_shape(core: SimEngineCore, prefill_allowed: bool, budget: int) -> tuple[bool, bool, bool, int]:
    if not core.chunked_prefill:
        if prefill_allowed and core.waiting:
            head = core.waiting.peek()
            fits = head.remote or _cdiv(head.target, core.block_size) <= core.pool.available
            if fits:  # prefill turn: whole prompts, no decode
                return True, False, True, max(budget, core.max_model_len, head.target)
        return False, True, True, budget  # decode turn
    if core.prefill_only_phase and core.phase == Phase.PREFILL and has_prefill_work(core):
        return True, False, False, budget
    return prefill_allowed, True, False, budget
