"""Prompts as chains of block ids — the common form of every workload here.

A request's prompt is `prompt_len` tokens cut into blocks of `block_tokens`; block j is named
by an integer id such that equal ids at a position ⇔ equal prompt prefixes up to that block's
end (Mooncake's `hash_ids` convention; the last, partial block has an id too). From there:

* the simulator maps ids to the engine's chain hashes (`shared.hashing.ids_chain`, one id per
  engine block: the engine's block size is the workload's `block_tokens`);
* a live run needs text: `BlockText` gives every id `block_tokens` characters of its own, so
  equal ids give identical text, and under the built-in byte tokenizer (1 ASCII char =
  1 token) identical token blocks, hence identical 16-token chain hashes at admission
  whenever `block_tokens` is a multiple of 16;
* `prefix_hit_bound`: the hit ratio of an infinite cache that keeps every block forever
  (Σ hit tokens / Σ prompt tokens, requests in arrival order, a hit being the longest run of
  leading full blocks seen before, and at least one prompt token always computed, as the
  engine does).

`PrefixIds` hands out ids for prompts described as a list of segments `(segment key,
length)`: block j's id is a function of (block j−1's id, the pieces of segments it covers),
so two prompts that share their first k segments share every block those segments fill.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a block-id workload."""

    index: int
    arrival_s: float
    """Offset from the workload's start, after rate/time scaling."""
    prompt_len: int
    max_tokens: int
    priority: int
    block_ids: tuple[int, ...]
    """One id per `block_tokens` tokens of the prompt, the last block possibly partial."""


class PrefixIds:
    """Block ids for prompts given as segments; equal leading segments ⇒ equal leading ids."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self._ids: dict[tuple, int] = {}

    def ids(self, segments: Sequence[tuple[object, int]]) -> tuple[int, ...]:
        """Ids of the blocks of a prompt made of `segments` = [(key, length), …]."""
        bs = self.block_tokens
        out: list[int] = []
        parent = -1
        pieces: list[tuple[object, int, int]] = []
        filled = 0
        for key, length in segments:
            start = 0
            while start < length:
                take = min(length - start, bs - filled)
                pieces.append((key, start, start + take))
                start += take
                filled += take
                if filled == bs:
                    parent = self._id(parent, pieces)
                    out.append(parent)
                    pieces, filled = [], 0
        if pieces:
            out.append(self._id(parent, pieces))
        return tuple(out)

    def _id(self, parent: int, pieces: list[tuple[object, int, int]]) -> int:
        key = (parent, tuple(pieces))
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got


def prefix_hit_bound(requests: Iterable[TraceRequest], block_tokens: int) -> float:
    """Hit ratio of an infinite cache over the requests (see the module docstring)."""
    seen: set[int] = set()
    hit_tokens = prompt_tokens = 0
    for r in requests:
        full = r.prompt_len // block_tokens
        hit = 0
        for bid in r.block_ids[:full]:
            if bid not in seen:
                break
            hit += 1
        hit_tokens += min(hit, (r.prompt_len - 1) // block_tokens) * block_tokens
        prompt_tokens += r.prompt_len
        seen.update(r.block_ids[:full])
    return hit_tokens / prompt_tokens if prompt_tokens else 0.0


class BlockText:
    """Deterministic text per block id: id b ↦ `block_tokens` characters cut from a fixed,
    seeded letter buffer at an offset that is a function of b alone."""

    def __init__(self, block_tokens: int, seed: int = 0, buffer_chars: int = 1 << 20):
        if buffer_chars <= block_tokens:
            raise ValueError("the text buffer must be longer than a block")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x746578]))
        self.block_tokens = block_tokens
        self._buf = _LETTERS[rng.integers(0, len(_LETTERS), size=buffer_chars)].tobytes().decode("ascii")
        self._span = buffer_chars - block_tokens

    def block(self, block_id: int) -> str:
        # Knuth's multiplicative hash spreads consecutive ids over the buffer.
        off = (block_id * 2654435761) % self._span
        return self._buf[off : off + self.block_tokens]

    def prompt(self, block_ids: Sequence[int], prompt_len: int) -> str:
        """`prompt_len` characters: the blocks' texts in order, the last one cut short."""
        text = "".join(self.block(b) for b in block_ids)
        if len(text) < prompt_len:
            raise ValueError(f"{len(block_ids)} blocks of {self.block_tokens} cannot cover {prompt_len} tokens")
        return text[:prompt_len]
