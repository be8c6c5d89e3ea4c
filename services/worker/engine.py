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
