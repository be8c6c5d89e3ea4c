"""The router's KV block index: which instances hold which prefix blocks, and for a request's
hash chain the cached-prefix length on every instance in one walk.

    holders[h]  = bitmask of instance slots holding block h      (one Python int per block)
    alive_k     = holders[c_0] & holders[c_1] & … & holders[c_k]  (c = the request's chain)
    hit(i)      = #{k : bit i ∈ alive_k}   blocks                 (longest cached prefix of i)

alive_k only loses bits as k grows, so each distinct value of alive covers one contiguous run
of k and hit = Σ_runs len(run) × bits(alive_run): one numpy product over the few distinct
values. Finding the runs need not touch every link: an instance that holds block k of a chain
holds blocks 0…k−1 (prefix closure: a request reaches block k only through 0…k−1, vLLM frees
a request's blocks tail first and evicts least recently used, so a head is never evicted
before its tail; predictions are stored whole and refreshed head-inclusive). So holders[c_k]
is monotone along the chain, and bisection finds each drop point in log₂ L lookups:
O(d log L) for d distinct drop points instead of L (a 7,500-block chain: ~13 lookups per
point). Where closure does not hold (lost events) the probes still AND what they see, so a
hole between two probes can over-count a hit; the engine then computes what it lacks.
`match_walk` is the exact walk over every link, the reference the bisection is tested
against.

Two ways blocks get in:
* precise: workers' KV events (vLLM shapes) store / remove / clear blocks per instance;
* approximate, for engines that publish no events (SGLang router, Dynamo `--no-kv-events`):
  the router records what it routed as predicted cache contents that expire after a TTL
  (Dynamo's approximate-mode default, `router_ttl_secs` = 120 s).

Bounded memory: a worker's blocks go when it is forgotten or clears its cache, predicted
ones when their TTL runs out, and past `max_blocks` distinct hashes the oldest-inserted
1/16 are dropped (a dropped entry costs a missed hit, not a wrong placement: the engine
still finds its own cache).

Hashes are tokenyard's chain hashes (signed 64-bit ints, shared.hashing). An 8-byte `bytes`
hash is read as the same int (big-endian, signed, as shared.hashing builds it); other byte
strings are kept as they are, so a chain given in bytes still matches itself.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from itertools import accumulate, islice, repeat, takewhile
from operator import and_

import numpy as np
from tokenyard.services.router import kernels
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

PRECISE = math.inf
"""Expiry of a block an instance reported itself: never (until removed)."""

GPU_MEDIA = (None, "GPU", "gpu")
"""KV events of other media (host-memory tiers) describe copies the router does not count as hits."""


def block_key(h: int | bytes) -> int | bytes:
    if type(h) is int:
        return h
    if isinstance(h, bytes | bytearray) and len(h) == 8:
        return int.from_bytes(h, "big", signed=True)
    return bytes(h)


class BlockIndex:
    def __init__(self, max_blocks: int = 8_000_000):
        self.max_blocks = max_blocks
        self.holders: dict[int | bytes, int] = {}
        """block hash → bitmask of the slots holding it (never 0: empty entries are deleted)."""
        self.held: list[dict[int | bytes, float] | None] = []
        """slot → {block hash → expiry}; PRECISE for reported blocks, a time for predicted ones."""
        self.slot_of: dict[str, int] = {}
        self.worker_of: list[str | None] = []
        self._free_slots: list[int] = []
        self._ttl: deque[tuple[float, int, int | bytes]] = deque()
        """(expiry, slot, hash) of predicted blocks in expiry order; stale rows are skipped."""
        self.reported: set[str] = set()
        """Workers that have published KV events (their entries are exact)."""
        self.version = 0
        """Bumped whenever a slot is assigned or freed (callers cache slot maps on it)."""
        self._one_count = np.zeros(1, dtype=np.int64)
        """The single run's count, for `_counts` (scratch, rewritten at each use)."""

    # ── slots ──
    @property
    def slots(self) -> int:
        return len(self.held)

    def slot(self, worker_id: str) -> int:
        s = self.slot_of.get(worker_id)
        if s is None:
            if self._free_slots:
                s = self._free_slots.pop()
                self.held[s], self.worker_of[s] = {}, worker_id
            else:
                s = len(self.held)
                self.held.append({})
                self.worker_of.append(worker_id)
            self.slot_of[worker_id] = s
            self.version += 1
        return s

    def forget(self, worker_id: str) -> None:
        """Drop every block of a worker and free its slot for reuse."""
        s = self.slot_of.pop(worker_id, None)
        if s is None:
            return
        self._clear(s)
        self.held[s], self.worker_of[s] = None, None
        self._free_slots.append(s)
        self.reported.discard(worker_id)
        self.version += 1

    # ── precise: KV events ──
    def apply(self, worker_id: str, batch: KVEventBatch) -> None:
        """Apply one worker's KV event batch. The first batch from a worker drops what was
        predicted for it: from then on its own reports are the truth."""
        s = self.slot(worker_id)
        if worker_id not in self.reported:
            self.reported.add(worker_id)
            self._clear(s)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.medium in GPU_MEDIA and ev.lora_id is None:
                    self._store(s, [block_key(h) for h in ev.block_hashes], PRECISE)
            elif isinstance(ev, BlockRemoved):
                if ev.medium in GPU_MEDIA:
                    self._remove(s, [block_key(h) for h in ev.block_hashes])
            elif isinstance(ev, AllBlocksCleared):
                self._clear(s)

    # ── approximate: predictions with a TTL ──
    def predict(self, worker_id: str, chain: Sequence[int], expiry: float) -> None:
        """Record that `worker_id` will hold `chain` until `expiry` (refreshing it if held).
        Expiries come in non-decreasing order (a constant TTL on a monotone clock)."""
        s = self.slot(worker_id)
        held = self.held[s]
        keys = [block_key(h) for h in chain]
        new = [k for k in keys if held.get(k, 0.0) != PRECISE]
        self._store(s, new, expiry)
        self._ttl.extend(zip(repeat(expiry), repeat(s), new, strict=False))

    def expire(self, now: float) -> int:
        """Drop predicted blocks whose TTL has run out; returns how many went."""
        gone = 0
        ttl, held_by = self._ttl, self.held
        while ttl and ttl[0][0] <= now:
            exp, s, h = ttl.popleft()
            held = held_by[s]
            if held is not None and held.get(h) == exp:  # not refreshed, reported or cleared since
                self._remove(s, [h])
                gone += 1
        return gone

    # ── lookups ──
    def match(self, chain: Sequence[int], pad: int = 0) -> np.ndarray:
        """Cached-prefix length in blocks of `chain` on every slot (int64, one per slot, then
        `pad` zeros), by bisection for the points where instances drop out of alive_k (see the
        module doc)."""
        if not chain or not self.holders:
            return np.zeros(self.slots + pad, dtype=np.int64)
        get = self.holders.get
        if type(chain[0]) is not int:
            chain = [block_key(h) for h in chain]
        first = get(chain[0], 0)
        if not first:
            return np.zeros(self.slots + pad, dtype=np.int64)
        runs: dict[int, int] = {}
        # Half-open spans [lo, hi) with alive(lo) = a, alive(hi) = b (alive(len) = 0), b ⊆ a.
        # A probe splits a span in two; a half whose ends agree is one run, counted at once,
        # and the loop goes on into the other half without a trip through the stack.
        stack = [(0, len(chain), first, 0)]
        push, pop = stack.append, stack.pop
        while stack:
            lo, hi, a, b = pop()
            while True:
                if a == b or hi - lo == 1:
                    runs[a] = runs.get(a, 0) + hi - lo
                    break
                mid = (lo + hi) >> 1
                m = get(chain[mid], 0) & a
                if m == a:  # nobody drops before mid
                    runs[a] = runs.get(a, 0) + mid - lo
                    lo = mid
                    continue
                if m == b:  # nobody drops from mid on (b may be 0: then nothing to count)
                    if m:
                        runs[m] = runs.get(m, 0) + hi - mid
                elif m:
                    push((mid, hi, m, b))
                hi, b = mid, m
        return self._counts(runs, pad)

    def match_walk(self, chain: Sequence[int]) -> np.ndarray:
        """The same as `match` by walking every link (exact without the prefix-closure
        assumption; the reference the bisection is tested against)."""
        if not chain or not self.holders:
            return np.zeros(self.slots, dtype=np.int64)
        keys = [block_key(h) for h in chain]
        alive = list(takewhile(bool, accumulate(map(self.holders.get, keys, repeat(0)), and_)))
        return self._counts(dict(Counter(alive)))

    def _counts(self, runs: dict[int, int], pad: int = 0) -> np.ndarray:
        """hit(i) = Σ_runs count × [i ∈ mask]: every run's mask as little-endian bytes in one
        buffer, and one compiled pass adding each run's count to the slots whose bit is set
        (services/router/kernels.py; round 7's unpackbits and int64 product took four numpy
        calls, 3–4 µs for one run and 8–13 for 2–4). Bits past the last slot are 0, so the
        `pad` entries come out 0."""
        size = self.slots + pad
        nbytes = (size + 7) // 8
        if len(runs) == 1:
            ((mask, count),) = runs.items()
            one = self._one_count
            one[0] = count  # np.full's Python-level steps cost as much as the kernel
            return kernels.spread_runs(np.frombuffer(mask.to_bytes(nbytes, "little"), np.uint8), one, size)
        masks = np.frombuffer(b"".join([m.to_bytes(nbytes, "little") for m in runs]), np.uint8)
        return kernels.spread_runs(masks, np.fromiter(runs.values(), np.int64, len(runs)), size)

    def blocks_held(self) -> np.ndarray:
        """Blocks each slot holds (int64, one per slot; 0 for a free slot)."""
        return np.fromiter((len(h) if h else 0 for h in self.held), np.int64, self.slots)

    def holders_of(self, h: int | bytes) -> list[str]:
        mask = self.holders.get(block_key(h), 0)
        return sorted(w for s, w in enumerate(self.worker_of) if w is not None and mask >> s & 1)

    def __len__(self) -> int:
        return len(self.holders)

    # ── internals ──
    def _store(self, s: int, keys: Iterable[int | bytes], expiry: float) -> None:
        bit = 1 << s
        holders, held = self.holders, self.held[s]
        for h in keys:
            holders[h] = holders.get(h, 0) | bit
            held[h] = expiry
        if len(holders) > self.max_blocks:
            self._shed(len(holders) - self.max_blocks + self.max_blocks // 16)

    def _remove(self, s: int, keys: Iterable[int | bytes]) -> None:
        keep = ~(1 << s)
        holders, held = self.holders, self.held[s]
        for h in keys:
            if held.pop(h, None) is None:
                continue
            m = holders[h] & keep
            if m:
                holders[h] = m
            else:
                del holders[h]

    def _clear(self, s: int) -> None:
        held = self.held[s]
        if held:
            self._remove(s, list(held))

    def _shed(self, n: int) -> None:
        """Drop the n oldest-inserted blocks from every holder (the memory bound)."""
        for h in list(islice(self.holders, n)):
            mask = self.holders.pop(h)
            while mask:
                low = mask & -mask
                self.held[low.bit_length() - 1].pop(h, None)
                mask ^= low
