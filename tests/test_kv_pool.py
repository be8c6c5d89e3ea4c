"""BlockPool: a tiny real pool, exact blocks and events (as vLLM's prefix-cache tests do),
plus properties: blocks are conserved, reference counts never go negative, and the KV
events, replayed, give the pool's cached set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.kv_pool import BlockPool
from tokenyard.shared import hashing
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored

BS = 2


def chain(tokens: list[int]) -> list[int]:
    return hashing.hash_chain(tokens, BS)


def stored(hashes, parent, tokens) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=BS,
        medium="GPU",
    )


def removed(hashes) -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes), medium="GPU")


def counts(p: BlockPool) -> tuple[int, int, int, int]:
    """(free, private, cached in use, cached evictable)."""
    return p.free, p.private, sum(1 for r in p.ref.values() if r > 0), len(p.lru)


def fill(p: BlockPool, tokens: list[int]) -> list[int]:
    """One request computes `tokens` from scratch: allocate, commit its full blocks."""
    hs = chain(tokens)
    assert p.allocate(len(hs))
    p.commit(hs, None, tokens)
    return hs


def test_a_new_pool_is_all_free():
    p = BlockPool(4, BS)
    assert counts(p) == (4, 0, 0, 0)
    assert (p.used, p.available, p.drain_events()) == (0, 4, [])


def test_allocate_takes_free_blocks_or_nothing():
    p = BlockPool(4, BS)
    assert p.allocate(3)
    assert counts(p) == (1, 3, 0, 0)
    assert not p.allocate(2)
    assert counts(p) == (1, 3, 0, 0)
    assert p.allocate(1)
    assert (p.used, p.available) == (4, 0)
    assert p.drain_events() == []


def test_commit_caches_full_blocks_with_parent_and_tokens():
    p = BlockPool(4, BS)
    toks = [1, 2, 3, 4, 5, 6]
    h = chain(toks)
    assert p.allocate(3)
    p.commit(h[:1], None, toks[:2])
    p.commit(h[1:], h[0], toks[2:])
    assert counts(p) == (1, 0, 3, 0)
    assert p.ref == {h[0]: 1, h[1]: 1, h[2]: 1}
    assert p.drain_events() == [stored(h[:1], None, [1, 2]), stored(h[1:], h[0], [3, 4, 5, 6])]
    assert p.drain_events() == []


def test_commit_without_tokens_is_a_replay():
    p = BlockPool(2, BS)
    p.allocate(2)
    p.commit([11, 12], 10, [])
    assert p.drain_events() == [stored([11, 12], 10, [])]


def test_release_makes_blocks_evictable_tail_first():
    p = BlockPool(4, BS)
    h = fill(p, [1, 2, 3, 4, 5, 6])
    p.allocate(1)
    p.release(h, 1)
    assert counts(p) == (1, 0, 0, 3)
    assert list(p.lru) == [h[2], h[1], h[0]]
    assert (p.used, p.available) == (0, 4)
    p.drain_events()
    # two more blocks than are free: the prefix's tail goes first, one event per allocation
    assert p.allocate(3)
    assert p.drain_events() == [removed([h[2], h[1]])]
    assert p.ref == {h[0]: 0} and list(p.lru) == [h[0]]
    assert p.match_prefix(h) == 1


def test_the_least_recently_released_prefix_is_evicted_first():
    p = BlockPool(4, BS)
    a = fill(p, [1, 2, 3, 4])
    b = fill(p, [9, 9, 8, 8])
    p.release(b, 0)
    p.release(a, 0)
    p.drain_events()
    assert p.allocate(3)
    assert p.drain_events() == [removed([b[1], b[0], a[1]])]
    assert list(p.lru) == [a[0]]


def test_acquire_pins_an_evictable_block():
    p = BlockPool(2, BS)
    h = fill(p, [1, 2, 3, 4])
    p.release(h, 0)
    p.acquire(h[:1])
    assert p.ref == {h[0]: 1, h[1]: 0} and list(p.lru) == [h[1]]
    assert p.available == 1
    assert not p.allocate(2)
    assert p.allocate(1)
    assert p.drain_events()[-1] == removed([h[1]])
    assert counts(p) == (0, 1, 1, 0)


def test_acquire_of_a_block_in_use_adds_a_reference():
    p = BlockPool(2, BS)
    h = fill(p, [1, 2, 3, 4])
    p.acquire(h)
    assert p.ref == {h[0]: 2, h[1]: 2}
    p.release(h, 0)
    assert p.ref == {h[0]: 1, h[1]: 1} and not p.lru


def test_match_prefix_stops_at_the_first_missing_block():
    p = BlockPool(4, BS)
    h = fill(p, [1, 2, 3, 4, 5, 6])
    assert p.match_prefix(h) == 3
    assert p.match_prefix(h[:2]) == 2
    assert p.match_prefix(chain([1, 2, 7, 7, 5, 6])) == 1
    assert p.match_prefix([]) == 0
    p.release(h, 0)
    assert p.match_prefix(h) == 3  # evictable blocks still count as cached
    p.allocate(3)  # one free, two evicted: the tail h[2], then h[1]
    assert p.match_prefix(h) == 1


def test_commit_splits_runs_around_already_cached_blocks():
    p = BlockPool(6, BS)
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    h = chain(toks)
    # another request cached h[1] and h[2] (say h[0] was evicted since); h[2] is in use, h[1] evictable
    p.allocate(2)
    p.commit(h[1:3], h[0], toks[2:6])
    p.release(h[1:2], 0)
    p.drain_events()
    assert counts(p) == (4, 0, 1, 1)
    # this request computed all four blocks privately
    assert p.allocate(4)
    p.commit(h, None, toks)
    assert p.drain_events() == [stored(h[:1], None, [1, 2]), stored(h[3:], h[2], [7, 8])]
    assert p.ref == {h[0]: 1, h[1]: 1, h[2]: 2, h[3]: 1}
    assert not p.lru
    # the two duplicates went back to the free list
    assert counts(p) == (2, 0, 4, 0)


def test_commit_of_an_already_cached_first_block():
    p = BlockPool(4, BS)
    toks = [1, 2, 3, 4]
    h = fill(p, toks[:2] + [0, 0])[:1] + chain(toks)[1:]
    p.drain_events()
    p.allocate(2)
    p.commit(h, None, toks)
    assert p.drain_events() == [stored(h[1:], h[0], [3, 4])]


def test_clear_forgets_evictable_blocks_only():
    p = BlockPool(4, BS)
    a = fill(p, [1, 2, 3, 4])
    b = fill(p, [5, 6])
    p.release(a, 0)
    p.drain_events()
    p.clear()
    assert p.ref == {b[0]: 1} and not p.lru
    assert counts(p) == (3, 0, 1, 0)
    # b is still cached: the events must not tell the router that nothing is
    assert p.drain_events() == [removed([a[1], a[0]])]
    p.release(b, 0)
    p.clear()
    assert counts(p) == (4, 0, 0, 0)
    assert p.drain_events() == [AllBlocksCleared()]


# ───────────────────────────── properties ─────────────────────────────

# Prompts over a few shared prefixes, so requests hit each other's blocks.
PROMPTS = [
    [1, 2, 3, 4, 5, 6],
    [1, 2, 3, 4, 7, 8],
    [1, 2, 9, 9],
    [5, 5, 5, 5, 5, 5, 5, 5],
    [1, 2, 3, 4, 5, 6, 7, 8],
    [3, 3],
]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, len(PROMPTS) - 1), st.integers(0, 2)),
        st.tuples(st.just("commit"), st.integers(0, 7), st.integers(1, 4)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


class _Req:
    def __init__(self, hashes: list[int], tokens: list[int], hit: int, private: int):
        self.hashes, self.tokens = hashes, tokens
        self.cached = hashes[:hit]
        self.private = private

    @property
    def pending(self) -> list[int]:
        return self.hashes[len(self.cached) : len(self.cached) + self.private]


def replay(events, index: set[int]) -> None:
    for e in events:
        if isinstance(e, BlockStored):
            assert not set(e.block_hashes) & index, "a block stored twice without a removal"
            index.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert set(e.block_hashes) <= index, "a block removed that was never stored"
            index.difference_update(e.block_hashes)
        else:
            index.clear()


def check(p: BlockPool, active: list[_Req], index: set[int]) -> None:
    free, private, in_use, evictable = counts(p)
    assert free >= 0 and private >= 0
    assert free + private + in_use + evictable == p.total
    assert all(r >= 0 for r in p.ref.values())
    assert set(p.lru) == {h for h, r in p.ref.items() if r == 0}
    # incrementally kept counts equal recomputed ones
    assert private == sum(r.private for r in active)
    refs: dict[int, int] = {}
    for r in active:
        for h in r.cached:
            refs[h] = refs.get(h, 0) + 1
    assert {h: n for h, n in p.ref.items() if n > 0} == refs
    assert p.used == private + in_use and p.available == free + evictable
    replay(p.drain_events(), index)
    assert index == set(p.ref)


@settings(max_examples=60, deadline=None)
@given(script=ops, total=st.integers(3, 10))
def test_blocks_are_conserved_and_events_mirror_the_cache(script, total):
    p = BlockPool(total, BS)
    active: list[_Req] = []
    index: set[int] = set()
    for op, a, b in script:
        if op == "start":
            toks = PROMPTS[a]
            hs = chain(toks)
            hit = p.match_prefix(hs)
            p.acquire(hs[:hit])
            need = len(hs) - hit + b  # b extra private blocks: a partial or generated block
            if p.allocate(need):
                active.append(_Req(hs, toks, hit, need))
            else:
                p.release(hs[:hit], 0)
        elif op == "commit" and active:
            r = active[a % len(active)]
            new = r.pending[:b]
            if new:
                k = len(r.cached)
                p.commit(new, r.hashes[k - 1] if k else None, r.tokens[k * BS : (k + len(new)) * BS])
                r.cached = r.cached + new
                r.private -= len(new)
        elif op == "release" and active:
            r = active.pop(a % len(active))
            p.release(r.cached, r.private)
        elif op == "clear":
            p.clear()
        check(p, active, index)
    for r in active:
        p.release(r.cached, r.private)
    check(p, [], index)
    assert p.used == 0 and p.available == total
