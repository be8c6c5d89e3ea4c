"""The one interface every engine behind a worker implements (simulated now, vLLM in issue
4), and one conformance suite (tests/test_engine_conformance.py) runs against each:

    async start() / stop()
    generate(req)       → async iterator of EngineOutput, the last one has finished=True
    async abort(id)     → the request's iterator ends with finish_reason "abort"
    stats()             → EngineStats (shared.schemas), carried whole in each heartbeat
    drain_kv_events()   → KV events (vLLM shapes) since the last call
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
from tokenyard.shared.schemas import AdmittedRequest, EngineStats, KVEvent

DEADLINE = "deadline"
"""The finish reason of a request the engine rejected unstarted past its TTFT deadline
(SCORPIO's rejection path: SimEngineCore.expire)."""

LONG_PREFILL_SHARE = 4
"""The default per-request chunk cap is this fraction of the step's token budget (below)."""


def default_long_prefill_token_threshold(max_num_batched_tokens: int) -> int:
    """Both engines' default for vLLM's `long_prefill_token_threshold`, the most prompt tokens
    one request may prefill in a step while another request is in the engine (vLLM V1:
    `num_new_tokens = min(num_new_tokens, threshold)` for running and waiting requests alike,
    not applied to a request alone in the engine; 0 = no cap):

        threshold = max_num_batched_tokens // LONG_PREFILL_SHARE        (A100: 2048 → 512)

    Without it a long prompt's chunks take the whole budget each step and every request that
    arrives behind it waits for its whole prefill (a 32k prompt: 16 steps, ~5 s on an A100);
    with it three quarters of each step stay for the others, and a step carrying a long
    chunk stays short (512 tokens ≈ 75 ms on an A100, within the fleet's 100 ms TPOT SLO), so
    the decodes batched with it keep their pace. A prompt alone still prefills at the full
    budget, and above ~256 tokens a step's cost per token is flat, so the cap costs a long
    prompt nothing when it is alone and its fair share when it is not."""
    return max(1, max_num_batched_tokens // LONG_PREFILL_SHARE)


class EngineOutput(msgspec.Struct):
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    """`length`, `stop` or `abort` once finished; `deadline` (DEADLINE): rejected unstarted."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


class Engine(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, req: AdmittedRequest) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def drain_kv_events(self) -> list[KVEvent]: ...
