"""The one interface every engine behind a worker implements (simulated now, vLLM in issue
4), and one conformance suite (tests/test_engine_conformance.py) runs against each:

    async start() / stop()
    generate(req)       → async iterator of EngineOutput, the last one has finished=True
    async abort(id)     → the request's iterator ends with finish_reason "abort"
    stats()             → EngineStats, for heartbeats
    drain_kv_events()   → KV events (vLLM shapes) since the last call
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
from tokenyard.shared.schemas import AdmittedRequest, KVEvent

DEADLINE = "deadline"
"""The finish reason of a request the engine rejected unstarted past its TTFT deadline
(SCORPIO's rejection path: SimEngineCore.expire)."""


class EngineOutput(msgspec.Struct):
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    """`length`, `stop` or `abort` once finished; `deadline` (DEADLINE): rejected unstarted."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


class EngineStats(msgspec.Struct):
    running: int
    waiting: int
    queued_prefill_tokens: int
    kv_blocks_used: int
    kv_blocks_free: int
    block_size: int
    step_time_ms: float = 0.0
    prefix_hits: int = 0
    """Prompt tokens found cached, summed over requests."""
    prefix_queries: int = 0
    """Prompt tokens looked up, summed over requests."""
    preemptions: int = 0
    kv_host_blocks_used: int = 0
    """Host-memory KV tier (warm): blocks holding cached prefixes or swapped requests."""
    kv_host_blocks_free: int = 0
    tpot_slack_ms: float | None = None
    """EcoServe: saved TPOT slack of the running decodes (their minimum); None: none decodes."""
    compute_util: float = 0.0
    """Share of the last step's token budget that was scheduled."""
    prefill_ms_per_token: float = 0.0
    """Prefill cost per token at a full chunk (the engine's own estimate); 0: unknown."""
    vbs: float = 0.0
    """SCORPIO (services/worker/sim/scorpio.py): virtual batch size, min TPOT SLO, VBS limit."""
    min_tpot_slo_ms: float = 0.0
    vbs_limit: float = 0.0
    prefill_ms_per_token2: float = 0.0
    """Attention's share of a prefill: an uncached prompt of L tokens takes about
    L·prefill_ms_per_token + L²·this ms; 0: unknown."""


class Engine(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, req: AdmittedRequest) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def drain_kv_events(self) -> list[KVEvent]: ...
