"""The one interface every engine behind a worker implements (simulated now, vLLM in issue
4), and one conformance suite (tests/test_engine_conformance.py) runs against each:

    async start() / stop()
    generate(req)       → async iterator of EngineOutput, the last one has finished=True
    async abort(id)     → the request's iterator ends with finish_reason "abort"
    stats()             → EngineStats (shared.schemas), carried whole in each heartbeat
    drain_kv_events()   → KV events (vLLM shapes) since the last call
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
from tokenyard.shared.schemas import AdmittedRequest, EngineStats, KVEvent

DEADLINE = "deadline"
"""The finish reason of a request the engine rejected unstarted past its TTFT deadline
(SCORPIO's rejection path: SimEngineCore.expire)."""

DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 0
"""Both engines' default for vLLM's `long_prefill_token_threshold`: the most prompt tokens one
request may prefill in a step while another request runs or waits (vLLM V1:
`num_new_tokens = min(num_new_tokens, threshold)` for running and waiting requests alike, not
applied to a request alone in the engine; 0 = no cap, vLLM's own default).

Off by default, measured (docs/results-bubble.md, "the cap in the bubble sweep"): a cap of a
quarter of the token budget (512 on an A100) lets a short prompt start one step into a 32k prefill instead of after
it (tests/test_sim_prefill_cap.py), but in the fleet it cost more than it gave — in the short
flood of seed 004 shorts wait in the queue, not in the engines (p50 0.31 s before their engine,
0.11 s in it), and capped long prefills lowered the fleet's throughput, so the queue wait grew
(bubble's short p50 0.46 → 0.93 s); on the chatbot priority run a capped P0 prompt needs more
steps (P0 p95 TTFT 324 → 507 ms; 379 ms at 1,024). `--long-prefill-token-threshold N` sets it
on either engine."""


class EarlyAborts:
    """Aborts that overtook their request into the engine: the worker accepted the offer and
    heard the abort before the engine began the request (its generation task had not run yet).
    Remembered (the newest `limit`), they end that request at once, with finish reason `abort`."""

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def take(self, request_id: str) -> bool:
        """Whether an abort came first (it is then forgotten: the id may run again)."""
        return self._ids.pop(request_id, "no") is None


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
