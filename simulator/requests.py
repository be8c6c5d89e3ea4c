"""A simulated request as the simulator follows it (ReqState), and the block-id → chain-hash
memo (ChainCache) shared by the runs of one comparison."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from tokenyard.loadgen.workloads.blocks import TraceRequest
from tokenyard.shared.hashing import block_hash


@dataclass
class ReqState:
    item: TraceRequest
    tokens: array = field(default_factory=lambda: array("d"))
    """Virtual time of every output token."""
    cached_tokens: int = 0
    worker: str = ""
    error: str | None = None
    message: str = ""
    """The failure's own words (admission's, the queue's or the engine's), as a live client reads them."""
    finished: bool = False
    expired: bool = False
    """Admitted, then rejected by the queue once its TTFT deadline passed."""
    refused_code: str = ""
    """Admission's refusal reason (Rejected.reason, else .code; '': not refused by admission)."""
    ttft_budget_s: float = 0.0
    """Its TTFT deadline less its arrival, as admission stamped it (shared.slo.ttft_deadline_s:
    class target + own predicted prefill, capped); 0: none (P3) or not admitted."""


class ChainCache:
    """Block ids → the engine's chain hashes (shared.hashing.ids_chain), memoised per
    (parent hash, id): a trace's shared prefixes are hashed once."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int | None, int], int] = {}

    def chain(self, ids: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        parent: int | None = None
        memo = self._memo
        for bid in ids:
            key = (parent, bid)
            h = memo.get(key)
            if h is None:
                h = memo[key] = block_hash(parent, (bid,))
            out.append(h)
            parent = h
        return out
