"""The block-hash chain of a prompt (vLLM's prefix-cache scheme, tokenyard's own hash).

    h_0 = H(ROOT, tokens[0:B]),  h_i = H(h_{i-1}, tokens[iB:(i+1)B])

for every *full* block of B tokens (a partial last block is not cacheable). H is the first
8 bytes of BLAKE2b as a signed 64-bit int, so hashes are stable across processes and
machines (Python's hash() is salted per process). Equal chains ⇔ equal prefixes, so the
longest cached prefix of a request is the longest run of its chain an instance holds.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
from tokenyard.shared.schemas import BlockHash

ROOT = b"tokenyard.v1"
DEFAULT_BLOCK_SIZE = 16


def _h(parent: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(parent + payload, digest_size=8).digest()


def _to_int(digest: bytes) -> BlockHash:
    return BlockHash(int.from_bytes(digest, "big", signed=True))


def block_hash(parent: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """One link of the chain: the hash of a block given its parent's hash (None for the first)."""
    parent_bytes = ROOT if parent is None else int(parent).to_bytes(8, "big", signed=True)
    return _to_int(_h(parent_bytes, struct.pack(f"<{len(tokens)}q", *tokens)))


def hash_chain(tokens: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> list[BlockHash]:
    """The hashes of every full block of `tokens`, each chained on the one before.

    The same links as `block_hash`, computed on bytes: the prompt is packed once and each
    parent's digest is fed on as it is (its 8 bytes are the signed int's big-endian form), so
    admission's per-request cost (a 2,000-token prompt: 125 links) is the hashing itself, not
    125 packs and int round trips — it was most of admission's CPU in a 10× burst; the digests
    become ints in one numpy pass, not one `int.from_bytes` call each."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    full = len(tokens) - len(tokens) % block_size
    if full == 0:
        return []
    data = struct.pack(f"<{full}q", *tokens[:full])
    step = 8 * block_size
    blake2b = hashlib.blake2b
    digests: list[bytes] = []
    parent = ROOT
    for start in range(0, len(data), step):
        parent = blake2b(parent + data[start : start + step], digest_size=8).digest()
        digests.append(parent)
    # every digest to its int at once (big-endian signed 64-bit, as int.from_bytes reads it)
    return np.frombuffer(b"".join(digests), dtype=">i8").tolist()


def ids_chain(block_ids: Sequence[int]) -> list[BlockHash]:
    """A chain for a trace that names blocks by id (Mooncake's `hash_ids`): block i's hash
    chains its id on its parent's, so equal id prefixes give equal hash prefixes."""
    chain: list[BlockHash] = []
    parent: BlockHash | None = None
    for block_id in block_ids:
        parent = block_hash(parent, (block_id,))
        chain.append(parent)
    return chain
