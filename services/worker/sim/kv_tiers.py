"""The host-memory KV tier (warm), below the GPU block pool (hot).

    capacity = cached + pinned + swapped + free           (conserved, in blocks)

* cached: prefix blocks the GPU pool evicted are demoted here (BlockStored, medium "CPU"),
  LRU; when full, the least recently demoted/used goes (BlockRemoved, medium "CPU"). A
  prefix lookup continues here past the GPU's longest cached prefix; a hit is promoted back
  to the GPU at the host link's cost (the copy stays here, as vLLM's CPU offloading keeps it).
  While the GPU makes room for them they are pinned (not evictable, still here).
* swapped: blocks a swap-preempted request parked here; held until it resumes (no LRU).
The demotion event carries no parent and no token ids: the pool keeps only hashes of what
it evicts; an index keyed by block hash needs nothing more. Events go into the GPU pool's
list, so GPU removal and host storage come out in the order they happened.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tokenyard.shared.schemas import BlockRemoved, BlockStored, KVEvent

MEDIUM = "CPU"


class HostTier:
    def __init__(self, capacity_blocks: int, block_size: int, events: list[KVEvent]):
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.pinned: dict[int, None] = {}
        self.swapped = 0
        self.events = events

    @property
    def free(self) -> int:
        return self.capacity - len(self.lru) - len(self.pinned) - self.swapped

    @property
    def cached(self) -> set[int]:
        return set(self.lru) | set(self.pinned)

    def match(self, chain: Sequence[int], start: int) -> int:
        """How many blocks of chain[start:] are here, in a row."""
        n = 0
        lru = self.lru
        for k in range(start, len(chain)):
            if chain[k] not in lru:
                break
            n += 1
        return n

    def pin(self, hashes: Sequence[int]) -> None:
        """Keep these through the GPU allocation that promotes them."""
        for h in hashes:
            del self.lru[h]
            self.pinned[h] = None

    def unpin(self, hashes: Sequence[int]) -> None:
        """Back in the LRU, most recently used."""
        for h in hashes:
            del self.pinned[h]
            self.lru[h] = None

    def demote(self, hashes: Sequence[int]) -> None:
        """Blocks the GPU evicted: keep what fits, evicting this tier's LRU ones."""
        room = self.capacity - self.swapped - len(self.pinned)
        if room <= 0:
            return
        new = [h for h in hashes if h not in self.lru and h not in self.pinned]
        for h in hashes:
            if h in self.lru:
                self.lru.move_to_end(h)
        new = new[-room:]  # more than fit: keep the latest
        self._make_room(len(new))
        for h in new:
            self.lru[h] = None
        if new:
            self.events.append(BlockStored(new, None, [], self.block_size, medium=MEDIUM))

    def reserve_swap(self, blocks: int) -> bool:
        """Room for a swapped-out request's blocks, evicting cached ones; False if it cannot fit."""
        if blocks > self.capacity - self.swapped - len(self.pinned):
            return False
        self._make_room(blocks)
        self.swapped += blocks
        return True

    def release_swap(self, blocks: int) -> None:
        self.swapped -= blocks

    def clear(self) -> None:
        """Forget the cached blocks (pinned and swapped ones stay)."""
        if self.lru:
            self.events.append(BlockRemoved(list(self.lru), medium=MEDIUM))
            self.lru.clear()

    def _make_room(self, n: int) -> None:
        gone = []
        while self.free < n:
            h, _ = self.lru.popitem(last=False)
            gone.append(h)
        if gone:
            self.events.append(BlockRemoved(gone, medium=MEDIUM))
