"""The router's KV block index: KV events in vLLM shapes (int and bytes hashes, media, LoRA),
the one-walk cached-prefix lengths (bisection against the exact walk and a brute-force
model), predictions with a TTL, forgetting workers, and the memory bound."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.index import PRECISE, BlockIndex, block_key
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


def stored(hashes, medium=None, lora=None) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=16,
                       lora_id=lora, medium=medium)  # fmt: skip


def batch(*events) -> KVEventBatch:
    return KVEventBatch(0.0, list(events))


def hits(ix: BlockIndex, chain) -> dict[str, int]:
    m = ix.match(chain)
    return {w: int(m[s]) for w, s in sorted(ix.slot_of.items())}


def test_stored_removed_cleared_and_the_prefix_lengths():
    ix = BlockIndex()
    ix.apply("a", batch(stored([1, 2, 3, 4])))
    ix.apply("b", batch(stored([1, 2]), stored([9])))
    ix.apply("c", batch(stored([5, 6])))
    assert len(ix) == 7
    assert hits(ix, [1, 2, 3, 4, 5]) == {"a": 4, "b": 2, "c": 0}
    assert hits(ix, [1, 2, 7]) == {"a": 2, "b": 2, "c": 0}
    assert hits(ix, [5, 6, 1]) == {"a": 0, "b": 0, "c": 2}
    assert hits(ix, [2, 3]) == {"a": 2, "b": 1, "c": 0}  # hashes, not positions, are matched
    ix.apply("a", batch(BlockRemoved(block_hashes=[4, 3])))
    assert hits(ix, [1, 2, 3, 4]) == {"a": 2, "b": 2, "c": 0}
    ix.apply("b", batch(AllBlocksCleared()))
    assert hits(ix, [1, 2, 3, 4]) == {"a": 2, "b": 0, "c": 0}
    assert ix.holders == {1: 0b001, 2: 0b001, 5: 0b100, 6: 0b100}
    assert ix.blocks_held().tolist() == [2, 0, 2]
    assert ix.holders_of(1) == ["a"] and ix.holders_of(42) == []


def test_removing_what_was_never_stored_changes_nothing():
    ix = BlockIndex()
    ix.apply("a", batch(stored([1, 2])))
    ix.apply("b", batch(BlockRemoved(block_hashes=[1, 2, 3])))
    ix.apply("a", batch(BlockRemoved(block_hashes=[3])))
    assert ix.holders == {1: 0b01, 2: 0b01}
    assert hits(ix, [1, 2]) == {"a": 2, "b": 0}


def test_bytes_hashes_read_as_the_fleet_ints():
    chain = ids_chain([7, 8, 9])
    as_bytes = [int(h).to_bytes(8, "big", signed=True) for h in chain]
    assert [block_key(b) for b in as_bytes] == chain
    assert block_key(b"\x01\x02\x03") == b"\x01\x02\x03"  # another engine's bytes stay bytes
    ix = BlockIndex()
    ix.apply("a", batch(stored(as_bytes)))
    ix.apply("b", batch(stored([b"xyz-longer-than-8", b"\x00"])))
    assert hits(ix, chain) == {"a": 3, "b": 0}
    assert hits(ix, as_bytes) == {"a": 3, "b": 0}
    assert hits(ix, [b"xyz-longer-than-8", b"\x00"]) == {"a": 0, "b": 2}
    ix.apply("a", batch(BlockRemoved(block_hashes=[as_bytes[2]])))
    assert hits(ix, chain) == {"a": 2, "b": 0}


def test_other_media_and_lora_blocks_are_not_hits():
    ix = BlockIndex()
    ix.apply("a", batch(stored([1, 2], medium="GPU"), stored([3], medium="CPU"), stored([4], lora=1)))
    assert set(ix.holders) == {1, 2}
    ix.apply("a", batch(BlockRemoved(block_hashes=[2], medium="CPU")))  # a host copy went, not the GPU one
    assert hits(ix, [1, 2]) == {"a": 2}


def test_predictions_expire_refresh_and_give_way_to_events():
    ix = BlockIndex()
    ix.predict("a", [1, 2, 3], expiry=10.0)
    ix.predict("b", [1], expiry=12.0)
    ix.predict("a", [1, 2], expiry=15.0)  # the shared head is refreshed, the tail is not
    assert hits(ix, [1, 2, 3]) == {"a": 3, "b": 1}
    assert ix.expire(9.9) == 0
    assert ix.expire(10.0) == 1
    assert hits(ix, [1, 2, 3]) == {"a": 2, "b": 1}
    assert ix.expire(12.0) == 1
    assert hits(ix, [1, 2, 3]) == {"a": 2, "b": 0}
    ix.predict("b", [7], expiry=16.0)
    ix.apply("b", batch(stored([8])))  # b publishes events: its predictions go, its reports stay
    assert "b" in ix.reported
    assert ix.held[ix.slot_of["b"]] == {8: PRECISE}
    ix.predict("b", [8, 9], expiry=20.0)  # a reported block keeps its report
    assert ix.held[ix.slot_of["b"]] == {8: PRECISE, 9: 20.0}
    assert ix.expire(30.0) == 3  # a's two blocks, b's 9
    assert ix.holders == {8: 0b10}


def test_forget_frees_the_slot_for_the_next_worker():
    ix = BlockIndex()
    ix.apply("a", batch(stored([1, 2])))
    ix.apply("b", batch(stored([1])))
    v = ix.version
    ix.forget("a")
    ix.forget("ghost")
    assert ix.version == v + 1
    assert ix.holders == {1: 0b10}
    assert "a" not in ix.reported and ix.worker_of == [None, "b"]
    ix.apply("c", batch(stored([2])))
    assert ix.slot_of == {"b": 1, "c": 0}
    assert hits(ix, [1, 2]) == {"b": 1, "c": 0}
    assert hits(ix, [2]) == {"b": 0, "c": 1}
    assert ix.blocks_held().tolist() == [1, 1]


def test_the_memory_bound_sheds_the_oldest_blocks():
    ix = BlockIndex(max_blocks=32)
    for k in range(4):
        ix.apply(f"w{k}", batch(stored(range(10 * k, 10 * k + 10))))
    # 40 blocks > 32: the oldest 8 + 32 // 16 = 10 went, from every holder
    assert len(ix) == 30
    assert min(ix.holders) == 10
    assert ix.blocks_held().tolist() == [0, 10, 10, 10]
    assert hits(ix, list(range(10))) == {"w0": 0, "w1": 0, "w2": 0, "w3": 0}


def test_many_slots_and_deep_chains():
    ix = BlockIndex()
    chain = list(range(1000, 3000))
    for k in range(300):  # worker k holds the first 7k blocks (capped at the chain)
        ix.apply(f"w{k:03d}", batch(stored(chain[: 7 * k])))
    want = np.minimum(7 * np.arange(300), len(chain))
    assert ix.match(chain).tolist() == want.tolist()
    assert ix.match_walk(chain).tolist() == want.tolist()
    assert ix.match(chain[:1]).tolist() == (want > 0).astype(int).tolist()
    assert ix.match([5, *chain]).tolist() == [0] * 300


# ───────────────────────────── properties ─────────────────────────────

prompts = st.lists(st.integers(0, 2), min_size=1, max_size=7)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 4), prompts),
        st.tuples(st.just("evict"), st.integers(0, 4), prompts),
        st.tuples(st.just("clear"), st.integers(0, 4), prompts),
        st.tuples(st.just("forget"), st.integers(0, 4), prompts),
    ),
    max_size=40,
)


def consistent(ix: BlockIndex) -> None:
    """The holder masks and the per-slot sets say the same thing (no empty masks kept)."""
    for h, mask in ix.holders.items():
        assert mask
        assert {s for s in range(ix.slots) if mask >> s & 1} == {
            s for s, held in enumerate(ix.held) if held and h in held
        }
    for held in ix.held:
        assert all(h in ix.holders for h in held or ())
    assert ix.blocks_held().tolist() == [len(h) if h else 0 for h in ix.held]


def brute(model: dict[str, set], chain) -> dict[str, int]:
    out = {}
    for w, held in model.items():
        k = 0
        while k < len(chain) and chain[k] in held:
            k += 1
        out[w] = k
    return out


@settings(max_examples=150, deadline=None)
@given(ops=ops, queries=st.lists(prompts, min_size=1, max_size=5))
def test_bisection_equals_the_walk_and_a_model_under_vllm_like_events(ops, queries):
    """Workers store whole prompt chains and evict only leaves (a block none of whose cached
    children remain, as LRU with tail-first release does): the bisection, the exact walk and
    a brute-force model agree on every query."""
    ix = BlockIndex()
    model: dict[str, set] = {}
    parent: dict[int, int | None] = {}
    for op, k, ids in ops:
        w, chain = f"w{k}", ids_chain(ids)
        for i, h in enumerate(chain):
            parent[h] = chain[i - 1] if i else None
        if op == "store":
            ix.apply(w, batch(stored(chain)))
            model.setdefault(w, set()).update(chain)
        elif op == "evict" and w in model:
            held = model[w]
            leaves = [h for h in chain if h in held and not any(parent.get(c) == h for c in held)]
            if leaves:
                ix.apply(w, batch(BlockRemoved(block_hashes=[leaves[-1]])))
                held.discard(leaves[-1])
        elif op == "clear" and w in model:
            ix.apply(w, batch(AllBlocksCleared()))
            model[w] = set()
        elif op == "forget":
            ix.forget(w)
            model.pop(w, None)
        assert set(ix.holders) == set().union(*model.values()) if model else not ix.holders
        consistent(ix)
    for ids in queries:
        chain = ids_chain(ids)
        want = brute(model, chain)
        assert hits(ix, chain) == want
        walk = ix.match_walk(chain)
        assert {w: int(walk[s]) for w, s in sorted(ix.slot_of.items())} == want


@settings(max_examples=100, deadline=None)
@given(
    removals=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 11)), max_size=20),
    query=st.lists(st.integers(0, 11), max_size=12),
)
def test_the_walk_is_exact_whatever_is_removed(removals, query):
    """Arbitrary removals (lost events, holes mid-chain): the walk still equals the model."""
    ix = BlockIndex()
    model = {f"w{k}": set(range(12)) for k in range(4)}
    for w in model:
        ix.apply(w, batch(stored(range(12))))
    for k, h in removals:
        ix.apply(f"w{k}", batch(BlockRemoved(block_hashes=[h])))
        model[f"w{k}"].discard(h)
    walk = ix.match_walk(query)
    assert {w: int(walk[s]) for w, s in sorted(ix.slot_of.items())} == brute(model, query)
