"""The block-hash chain (shared.hashing): exact values, chaining, and the prefix property."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.shared import hashing


def _ref(parent: bytes, tokens: list[int]) -> int:
    """The chain link re-derived from the module's docstring: BLAKE2b-64 of parent ‖ tokens."""
    digest = hashlib.blake2b(parent + struct.pack(f"<{len(tokens)}q", *tokens), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def test_first_link_hashes_the_root_and_the_tokens():
    assert hashing.block_hash(None, [1, 2, 3, 4]) == _ref(b"tokenyard.v1", [1, 2, 3, 4])
    # Pinned: a hash that changes breaks every stored trace and every router's index.
    assert hashing.block_hash(None, [1, 2, 3, 4]) == 853546551817513747


def test_each_link_chains_on_its_parent():
    h0 = hashing.block_hash(None, [1, 2, 3, 4])
    h1 = hashing.block_hash(h0, [5, 6, 7, 8])
    assert h1 == _ref(h0.to_bytes(8, "big", signed=True), [5, 6, 7, 8])
    assert h1 == -6631885002597520347


def test_chain_covers_full_blocks_only():
    # 9 tokens in blocks of 4: two full blocks; the partial ninth token is not cacheable.
    assert hashing.hash_chain([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [853546551817513747, -6631885002597520347]
    assert hashing.hash_chain(list(range(32)), 16) == [-7530529017471634127, -2664909214435680499]
    assert hashing.hash_chain([1, 2, 3], 4) == []
    assert hashing.hash_chain([], 4) == []


def test_chain_uses_the_default_block_size_of_16():
    assert hashing.DEFAULT_BLOCK_SIZE == 16
    assert hashing.hash_chain(list(range(40))) == hashing.hash_chain(list(range(40)), 16)
    assert len(hashing.hash_chain(list(range(40)))) == 2


@pytest.mark.parametrize("block_size", [0, -1])
def test_non_positive_block_size_is_refused(block_size):
    with pytest.raises(ValueError, match="block_size must be positive"):
        hashing.hash_chain([1, 2, 3], block_size)


def test_same_tokens_in_a_different_position_hash_differently():
    a = hashing.hash_chain([1, 1, 1, 1, 2, 2, 2, 2], 4)
    b = hashing.hash_chain([2, 2, 2, 2, 2, 2, 2, 2], 4)
    assert a[1] != b[1]  # same block content, different parent
    assert hashing.block_hash(None, [2, 2, 2, 2]) == b[0]


def test_ids_chain_is_a_chain_of_one_token_blocks():
    assert hashing.ids_chain([7, 8]) == hashing.hash_chain([7, 8], 1)
    assert hashing.ids_chain([7, 8]) == [-6604929498693578320, 8953981021143156477]
    assert hashing.ids_chain([]) == []


def test_hashes_are_signed_64_bit_ints():
    for h in hashing.hash_chain(list(range(16 * 50)), 16):
        assert isinstance(h, int)
        assert -(2**63) <= h < 2**63


tokens = st.lists(st.integers(min_value=0, max_value=300), max_size=64)


@settings(max_examples=50, deadline=None)
@given(a=tokens, b=tokens, block_size=st.integers(min_value=1, max_value=8))
def test_equal_chain_prefixes_are_equal_block_prefixes(a, b, block_size):
    ca, cb = hashing.hash_chain(a, block_size), hashing.hash_chain(b, block_size)
    assert len(ca) == len(a) // block_size
    common = 0
    while common < min(len(ca), len(cb)) and ca[common] == cb[common]:
        common += 1
    same_blocks = 0
    while (
        same_blocks < min(len(ca), len(cb))
        and a[same_blocks * block_size : (same_blocks + 1) * block_size]
        == b[same_blocks * block_size : (same_blocks + 1) * block_size]
    ):
        same_blocks += 1
    assert common == same_blocks


@settings(max_examples=50, deadline=None)
@given(a=tokens, extra=tokens, block_size=st.integers(min_value=1, max_value=8))
def test_extending_a_prompt_extends_its_chain(a, extra, block_size):
    ca = hashing.hash_chain(a, block_size)
    assert hashing.hash_chain(a + extra, block_size)[: len(ca)] == ca


@settings(max_examples=80, deadline=None)
@given(a=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=80),
       block_size=st.integers(min_value=1, max_value=16))
def test_the_chain_is_its_links_one_by_one(a, block_size):
    """hash_chain packs the prompt once and chains digests as bytes: the same links as
    block_hash applied block by block, for any token value a 64-bit slot holds."""
    parent, links = None, []
    for start in range(0, len(a) - block_size + 1, block_size):
        parent = hashing.block_hash(parent, a[start : start + block_size])
        links.append(parent)
    assert hashing.hash_chain(a, block_size) == links
