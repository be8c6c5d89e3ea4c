"""Paged KV cache with prefix caching, as vLLM V1's block pool keeps it.

Every block is in exactly one state:
    free      — holds nothing;
    private   — in use by one request, not (yet) cacheable (partial or generated-token block);
    cached    — holds a full prompt block, named by its chain hash, with a reference count;
                at ref 0 it stays cached but is evictable, in LRU order.
    total = free + private + cached(ref > 0) + cached(ref = 0)        (conserved)

Allocation takes free blocks first, then evicts the least recently released cached block
(BlockRemoved), which a host tier below, when there is one, takes in (kv_tiers.py).
A request's full prompt blocks become cached as its prefill computes them
(BlockStored, carrying the parent hash, like vLLM's events). Events queue up in `events`
for the shell to publish; the pool itself does no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.kv_tiers import HostTier

MEDIUM = "GPU"


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.total = num_blocks
        self.block_size = block_size
        self.free = num_blocks
        self.private = 0
        self.ref: dict[int, int] = {}
        """cached block hash → reference count (ref-0 blocks also sit in `lru`)."""
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.events: list[KVEvent] = []
        self.host: HostTier | None = None
        """Where evicted cached blocks are demoted (None: they are gone)."""

    @property
    def used(self) -> int:
        return self.total - self.free - len(self.lru)

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free plus evictable."""
        return self.free + len(self.lru)

    def match_prefix(self, chain: Sequence[int]) -> int:
        """How many leading blocks of `chain` are cached."""
        n = 0
        for h in chain:
            if h not in self.ref:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        for h in hashes:
            if self.ref[h] == 0:
                del self.lru[h]
            self.ref[h] += 1

    def allocate(self, n: int) -> bool:
        """n private blocks, evicting LRU cached ones if needed; False (nothing taken) if short."""
        if n > self.available:
            return False
        evicted = []
        while self.free < n:
            h, _ = self.lru.popitem(last=False)
            del self.ref[h]
            evicted.append(h)
            self.free += 1
        if evicted:
            self.events.append(BlockRemoved(block_hashes=evicted, medium=MEDIUM))
            if self.host is not None:
                self.host.demote(evicted)
        self.free -= n
        self.private += n
        return True

    def commit(self, hashes: Sequence[int], parent: int | None, token_ids: Sequence[int]) -> None:
        """Turn len(hashes) of the caller's private blocks into cached ones named by `hashes`
        (consecutive links of one chain; `parent` precedes hashes[0]; `token_ids` are their
        tokens, or empty for a replay without text). A hash already cached (another request
        computed the same block) takes a reference on the existing block instead and frees
        the duplicate. One BlockStored per run of newly cached blocks, as vLLM emits."""
        run: list[int] = []
        run_start = 0
        for k, h in enumerate(hashes):
            self.private -= 1
            if h in self.ref:
                self.free += 1
                if self.ref[h] == 0:
                    del self.lru[h]
                self.ref[h] += 1
                self._stored(run, run_start, parent, hashes, token_ids)
                run = []
            else:
                self.ref[h] = 1
                if not run:
                    run_start = k
                run.append(h)
        self._stored(run, run_start, parent, hashes, token_ids)

    def _stored(self, run: list[int], start: int, parent: int | None, hashes: Sequence[int], tokens: Sequence[int]) -> None:
        if not run:
            return
        bs = self.block_size
        self.events.append(
            BlockStored(
                block_hashes=run,
                parent_block_hash=parent if start == 0 else hashes[start - 1],
                token_ids=list(tokens[start * bs : (start + len(run)) * bs]),
                block_size=bs,
                medium=MEDIUM,
            )
        )

    def release(self, cached: Sequence[int], private: int) -> None:
        """Drop a request's blocks: private ones become free, cached ones lose a reference
        and, at zero, become evictable (most recently used last: freed in reverse, as vLLM
        does, so a prefix's tail is evicted before its head)."""
        self.private -= private
        self.free += private
        for h in reversed(cached):
            self.ref[h] -= 1
            if self.ref[h] == 0:
                self.lru[h] = None

    def clear(self) -> None:
        """Forget every evictable cached block (vLLM's reset_prefix_cache). Blocks in use stay
        cached, so then the event names what was forgotten: AllBlocksCleared would tell the
        router's index that nothing is cached here."""
        forgotten = list(self.lru)
        for h in forgotten:
            del self.ref[h]
        self.free += len(forgotten)
        self.lru.clear()
        if self.ref:
            if forgotten:
                self.events.append(BlockRemoved(block_hashes=forgotten, medium=MEDIUM))
        else:
            self.events.append(AllBlocksCleared())

    def drain_events(self) -> list[KVEvent]:
        out, self.events = self.events, []
        if self.host is not None:
            self.host.events = self.events  # one list: events come out in the order they happened
        return out
