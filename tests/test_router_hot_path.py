"""What the router's decision keeps between decisions instead of recomputing (round 7's hot
path): the `load` column (running + waiting, kept by heartbeats and routing), the row → slot
map that is skipped where rows and slots coincide, the candidates' index array, and the
multi-run prefix count. Each against what recomputing it gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.index import BlockIndex
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import BlockStored, KVEventBatch

from tests.builders import hb, req

WORKERS = [f"w{i}" for i in range(6)]


def store(core: RouterCore, wid: str, chain: list[int]) -> None:
    core.on_kv_events(wid, KVEventBatch(0.0, [BlockStored(chain, None, [], 16)]), 0.0)


@settings(max_examples=60, deadline=None)
@given(beats=st.permutations(WORKERS), events=st.permutations(WORKERS),
       held=st.lists(st.integers(0, 12), min_size=6, max_size=6), asked=st.integers(1, 12),
       gone=st.sampled_from([None, *WORKERS]))
def test_each_row_gets_its_own_workers_hit_whatever_order_the_view_and_index_learned_them(
        beats, events, held, asked, gone):
    """Rows (heartbeat order) and index slots (KV-event order) differ in general and coincide
    when both orders agree; either way row i's hit is its worker's, and a worker the index
    does not know (forgotten there) hits nothing."""
    core = RouterCore(RouterConfig(policy="least-loaded", stale_after_s=1e9))
    for w in beats:
        core.on_heartbeat(hb(w), 0.0)
    full = ids_chain(range(12))
    for w, k in zip(events, held, strict=True):
        store(core, w, full[:k])
    if gone is not None:
        core.index.forget(gone)
    chain = full[:asked]
    blocks = core.hit_blocks(req(prompt_len=16 * asked, chain=chain))
    want = {w: 0 if w == gone else min(held[events.index(w)], asked) for w in WORKERS}
    assert (blocks is None) == (max(want.values()) == 0)  # None: nobody holds the first block
    got = {w: 0 if blocks is None else int(blocks[core.view.slot[w]]) for w in WORKERS}
    assert got == want


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("beat"), st.sampled_from(WORKERS), st.integers(0, 40), st.integers(0, 40)),
    st.tuples(st.just("route"), st.integers(1, 2_000), st.just(0), st.just(0)),
), min_size=1, max_size=40))
def test_the_kept_load_equals_running_plus_waiting_after_any_beats_and_routes(steps):
    core = RouterCore(RouterConfig(stale_after_s=1e9))
    for w in WORKERS[:3]:
        core.on_heartbeat(hb(w), 0.0)
    for k, (kind, a, b, c) in enumerate(steps):
        if kind == "beat":
            core.on_heartbeat(hb(a, running=b, waiting=c, queued=10 * b), float(k))
        else:
            assert core.route(req(f"r{k}", prompt_len=a), float(k)).worker_id is not None
        v = core.view
        assert v.load[: v.n].tolist() == (v.running[: v.n] + v.waiting[: v.n]).tolist()


def test_the_candidates_index_array_is_kept_read_only_and_follows_the_fleet_size():
    core = RouterCore(RouterConfig(policy="least-loaded", stale_after_s=1e9))
    for w in WORKERS[:2]:
        core.on_heartbeat(hb(w), 0.0)
    rows = core.view.every_row()
    assert rows.tolist() == [0, 1] and core.view.every_row() is rows
    with pytest.raises(ValueError):
        rows[0] = 1
    core.on_heartbeat(hb("w5"), 0.0)
    assert core.view.every_row().tolist() == [0, 1, 2]


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(1, 40), min_size=2, max_size=6), slots=st.integers(1, 70),
       pad=st.integers(0, 2), data=st.data())
def test_a_match_of_several_runs_counts_what_the_walk_counts(cuts, slots, pad, data):
    """Nested holder sets along one chain (each worker holds a prefix of it): the bisection's
    runs, counted by one unpack and one product, equal the link-by-link walk, on fleets whose
    slot count crosses byte boundaries."""
    ix = BlockIndex()
    chain = ids_chain(range(max(cuts)))
    for s in range(slots):
        ix.apply(f"w{s}", KVEventBatch(0.0, [BlockStored(chain[: data.draw(st.sampled_from(cuts))], None, [], 16)]))
    got = ix.match(chain, pad=pad)
    assert got.dtype == np.int64 and len(got) == slots + pad
    assert got[:slots].tolist() == ix.match_walk(chain).tolist() and not got[slots:].any()
