"""vLLM's KV events → the fleet's block hashes.

vLLM names a cached block by its own hash (sha256 of parent hash, tokens and extra keys,
over *its* block size B_v: 128 by default on CPU, 16 on CUDA). The fleet names blocks by
tokenyard's chain (shared.hashing) over the *fleet's* block size B_f (16 by default), which
admission computed for every request and the router's index is keyed on. The two are
distinct types (Dynamo keeps engine-side and router-side hashes apart for the same reason):
the relay recomputes the fleet chain from each event's token ids.

    BlockStored(hashes=[v_1..v_n], parent=v_0, token_ids, B_v)
      state(v_0) = (f, pending)   the fleet chain's last hash and the tokens after it
                                  (root: (None, ()); B_v a multiple of B_f: pending = ())
      for each v_k with its B_v tokens t_k:
          toks = pending + t_k;  for each whole B_f slice s of toks: f = H(f, s)  → owned(v_k)
          state(v_k) = (f, the leftover tokens)
      → one BlockStored(fleet hashes of all whole fleet blocks, parent = f before them, B_f)

    e.g. B_v = 128, B_f = 16: one vLLM block = 8 fleet blocks, exactly hash_chain(prompt, 16)
    over those 128 tokens. A prompt's tail shorter than B_v is not cached by vLLM, so the
    fleet sees cached prefixes in steps of B_v tokens (coarser, never wrong).

    BlockRemoved([v, …])  → BlockRemoved(fleet hashes owned by v and by no other live vLLM
                            block: refcounted, since two vLLM hashes can cover the same
                            fleet blocks, e.g. a partial-block entry and its full block)

Each event keeps vLLM's `medium` (GPU; CPU for the offloading connector's host tier), and
liveness is counted per medium: the GPU block and its offloaded copy come and go apart.
    AllBlocksCleared      → AllBlocksCleared

A parent the relay never saw (events lost) cannot be chained: the event is dropped and
counted (`unmapped`); the router then just sees fewer hits. Chain states outlive their
block's removal (bounded LRU) so a child stored after its parent's eviction still maps.
Events carrying LoRA / multimodal / cache-salt extra keys, or of a KV-cache group other
than the first, are not on the fleet's token-only chain and are skipped (tokenyard sends
none of those).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from tokenyard.shared.hashing import block_hash
from tokenyard.shared.schemas import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent

EngineBlockHash = NewType("EngineBlockHash", object)
"""vLLM's block hash (an int, or bytes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""


@dataclass
class _Live:
    owned: list[BlockHash]
    """Fleet blocks completed inside this vLLM block."""


@dataclass
class RelayCounters:
    stored: int = 0
    removed: int = 0
    unmapped: int = 0
    """Events dropped: unknown parent."""
    skipped: int = 0
    """Events not on the token-only chain (extra keys, other KV-cache group)."""
    cleared: int = 0


class KVHashRelay:
    def __init__(self, fleet_block_size: int, chain_capacity: int = 1 << 18):
        if fleet_block_size <= 0:
            raise ValueError("fleet_block_size must be positive")
        self.fleet_block_size = fleet_block_size
        self.chain_capacity = chain_capacity
        self._chain: OrderedDict[Any, tuple[BlockHash | None, tuple[int, ...]]] = OrderedDict()
        """vLLM hash → (last fleet hash at its end, tokens after that hash); LRU-bounded."""
        self._live: dict[tuple[str | None, Any], _Live] = {}
        """(medium, vLLM hash) of the blocks vLLM holds now: an offloaded copy (medium CPU)
        and the GPU block of the same hash are two blocks, stored and removed apart."""
        self._owners: dict[tuple[str | None, BlockHash], int] = {}
        """(medium, fleet hash) → how many live vLLM blocks own it."""
        self.counters = RelayCounters()

    def fleet_hashes(self, engine_hash: EngineBlockHash, medium: str | None = "GPU") -> list[BlockHash]:
        """The fleet blocks a live vLLM block covers (empty when unknown)."""
        live = self._live.get((medium, engine_hash))
        return list(live.owned) if live else []

    def translate(self, events: Iterable[Any]) -> list[KVEvent]:
        """Fleet events for a batch of vLLM events (any objects with vLLM's field names)."""
        out: list[KVEvent] = []
        for ev in events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                e = self._stored(ev)
            elif kind == "BlockRemoved":
                e = self._removed(ev)
            elif kind == "AllBlocksCleared":
                self._live.clear()
                self._owners.clear()
                self.counters.cleared += 1
                e = AllBlocksCleared()
            else:
                e = None
            if e is not None:
                out.append(e)
        return out

    def _on_chain(self, ev: Any) -> bool:
        if getattr(ev, "group_idx", None) not in (None, 0):
            return False
        if getattr(ev, "lora_id", None) is not None or getattr(ev, "lora_name", None) is not None:
            return False
        extra = getattr(ev, "extra_keys", None)
        return not extra or all(k is None or len(k) == 0 for k in extra)

    def _stored(self, ev: Any) -> BlockStored | None:
        if not self._on_chain(ev) or not ev.block_size or not ev.token_ids:
            # not on the token-only chain, or a placeholder without tokens (the offloading
            # connector's events when not self-describing)
            self.counters.skipped += 1
            return None
        parent = ev.parent_block_hash
        if parent is None:
            tail, pending = None, ()
        elif parent in self._chain:
            self._chain.move_to_end(parent)
            tail, pending = self._chain[parent]
        else:
            self.counters.unmapped += 1
            return None
        hashes: Sequence[Any] = ev.block_hashes
        tokens: Sequence[int] = ev.token_ids
        per = len(tokens) // len(hashes) if hashes else 0
        fbs = self.fleet_block_size
        medium = getattr(ev, "medium", None)
        first_parent = tail  # the chain only moves on a completed fleet block
        new: list[BlockHash] = []
        new_tokens: list[int] = []
        for k, vh in enumerate(hashes):
            chunk = tokens[k * per : (k + 1) * per] if k < len(hashes) - 1 else tokens[k * per :]
            toks = (*pending, *chunk)
            owned: list[BlockHash] = []
            whole = len(toks) - len(toks) % fbs
            for i in range(0, whole, fbs):
                tail = block_hash(tail, toks[i : i + fbs])
                owned.append(tail)
            pending = tuple(toks[whole:])
            new.extend(owned)
            new_tokens.extend(toks[:whole])
            self._remember(vh, tail, pending)
            if (medium, vh) not in self._live:
                self._live[(medium, vh)] = _Live(owned)
                for f in owned:
                    self._owners[(medium, f)] = self._owners.get((medium, f), 0) + 1
        if not new:
            return None
        self.counters.stored += 1
        return BlockStored(
            block_hashes=list(new), parent_block_hash=first_parent, token_ids=new_tokens,
            block_size=fbs, medium=medium,
        )

    def _remember(self, vh: Any, tail: BlockHash | None, pending: tuple[int, ...]) -> None:
        self._chain[vh] = (tail, pending)
        self._chain.move_to_end(vh)
        while len(self._chain) > self.chain_capacity:
            self._chain.popitem(last=False)

    def _removed(self, ev: Any) -> BlockRemoved | None:
        if getattr(ev, "group_idx", None) not in (None, 0):
            self.counters.skipped += 1
            return None
        medium = getattr(ev, "medium", None)
        gone: list[BlockHash] = []
        for vh in ev.block_hashes:
            live = self._live.pop((medium, vh), None)
            if live is None:
                continue
            for f in live.owned:
                n = self._owners.get((medium, f), 0) - 1
                if n <= 0:
                    self._owners.pop((medium, f), None)
                    gone.append(f)
                else:
                    self._owners[(medium, f)] = n
        if not gone:
            return None
        self.counters.removed += 1
        return BlockRemoved(block_hashes=list(gone), medium=medium)
