"""KV cache events in vLLM's own shapes (`vllm.distributed.kv_events`), field for field: array-like,
tagged by class name, so a vLLM worker's events decode here without translation. A worker
publishes them batched on `llm.v1.kv.<id>`; the router's block index reads them. Re-exported
by shared.schemas, where every message is read.
"""

from __future__ import annotations

import msgspec
from tokenyard.shared.ints import Int64


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of vLLM's KV cache events."""


def _check_block_hashes(hashes: list[int | bytes]) -> None:
    """vLLM's int block hashes may be unsigned 64-bit, past what msgspec can bound: a hash outside
    MessagePack's 64 bits (either sign; JSON carries any) is a ValidationError where decoded."""
    for h in hashes:
        if type(h) is int and not -(2**63) <= h < 2**64:
            raise ValueError(f"block hash {h} does not fit in 64 bits")


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[Int64]
    block_size: Int64
    lora_id: Int64 | None = None
    medium: str | None = None

    def __post_init__(self) -> None:
        parent = self.parent_block_hash
        _check_block_hashes(self.block_hashes if parent is None else [*self.block_hashes, parent])


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None = None

    def __post_init__(self) -> None:
        _check_block_hashes(self.block_hashes)


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: Int64 | None = None
