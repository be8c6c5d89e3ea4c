"""The default policy, marginal latency: exact costs, the router's default, affinity that
survives overload where the guarded product drops it, and monotonicity as a property."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.core import DEFAULT_POLICY, POLICIES, RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.policies.latency import BoundedLoadGuard, MarginalLatencyScorer
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import BlockStored, KVEventBatch

from tests.builders import hb, req

BS = 16


def view(*rows) -> FleetView:
    """rows: (running, waiting, queued, hit tokens); new and P as the core sets them."""
    v = FleetView()
    for k, (running, waiting, queued, _) in enumerate(rows):
        v.upsert(hb(f"w{k}", running=running, waiting=waiting, queued=queued), 0.0)
    return v


def prepared(v: FleetView, prompt_len: int, hits: list[int]) -> FleetView:
    n = v.n
    v.hit[:n] = hits
    v.new[:n] = np.maximum(prompt_len - v.hit[:n], 1)
    v.p[:n] = v.queued_prefill[:n] + v.new[:n]
    return v


def test_the_default_is_marginal_latency_everywhere():
    assert DEFAULT_POLICY == "marginal-latency" == RouterConfig().policy
    assert {"multiplicative", "multiplicative-exact"} <= set(POLICIES)  # the seed's, kept by name


def test_exact_costs():
    # B = 2, 1, 6 → B̄ = 3; new = 128, 640, 640
    v = prepared(view((2, 0, 1000, 0), (0, 1, 0, 0), (4, 2, 200, 0)), 640, [512, 0, 0])
    scored = MarginalLatencyScorer().score(req(prompt_len=640), v, np.arange(3))
    # w0: 1000 + 128 + 128·(2+3)/2 = 1448;  w1: 640 + 640·(1+3)/2 = 1920;  w2: 840 + 640·(6+3)/2 = 3720
    assert scored.scores.tolist() == [1448.0, 1920.0, 3720.0]
    assert scored.tiebreak.tolist() == [1128.0, 640.0, 840.0]  # own TTFT: queue + own prefill
    # on a subset the fleet mean is the candidates': w1, w2 → B̄ = 3.5
    assert MarginalLatencyScorer().score(req(prompt_len=640), v, np.array([1, 2])).scores.tolist() == [2080.0, 3880.0]


def test_affinity_survives_overload_where_the_guarded_product_drops_it():
    """Every instance overloaded (60 sequences, ~200k tokens queued); one holds 8,192 of the
    request's 8,600 tokens behind a longer queue. The guard keeps it (within 1.25 × the
    shortest queue), then the product picks the shorter queue and recomputes 8,600 tokens;
    marginal latency pays 30k tokens of queue to save 8,192 tokens × 61 stalled sequences."""
    prefix = ids_chain(range(512))
    routes = {}
    for policy in ("multiplicative", "marginal-latency"):
        c = RouterCore(RouterConfig(policy=policy, stale_after_s=1.0))
        c.on_heartbeat(hb("holder", running=60, queued=230_000), 0.0)
        for k in range(3):
            c.on_heartbeat(hb(f"other{k}", running=60, queued=200_000), 0.0)
        c.on_kv_events("holder", KVEventBatch(0.0, [BlockStored(prefix, None, [], BS)]), 0.0)
        routes[policy] = c.route(req(prompt_len=8_600, chain=ids_chain(range(537))), 0.0)
    assert routes["marginal-latency"].worker_id == "holder"
    assert routes["marginal-latency"].hit_tokens == 8_192
    assert routes["multiplicative"].worker_id == "other0" and routes["multiplicative"].hit_tokens == 0


fleets = st.lists(
    st.tuples(st.integers(0, 64), st.integers(0, 64), st.integers(0, 300_000), st.integers(0, 8_000)),
    min_size=2,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(fleet=fleets, prompt=st.integers(1, 8_000))
def test_no_more_queue_work_or_sequences_never_costs_more(fleet, prompt):
    """Monotone in every load it prices: an instance with no more queued tokens, uncached
    tokens and sequences than another never scores worse, whatever the request's size."""
    v = prepared(view(*fleet), prompt, [min(h, prompt) for *_, h in fleet])
    cand = np.arange(v.n)
    cost = MarginalLatencyScorer().score(req(prompt_len=prompt), v, cand).scores
    q, n, b = v.queued_prefill[: v.n], v.new[: v.n], v.running[: v.n] + v.waiting[: v.n]
    for i in range(v.n):
        for j in range(v.n):
            if q[i] <= q[j] and n[i] <= n[j] and b[i] <= b[j]:
                assert cost[i] <= cost[j]


# ───────────────────────────── the bounded-load guard ─────────────────────────────


def test_bounded_load_keeps_the_candidates_within_c_times_the_mean():
    # L = 0, 4, 5, 11 → Σ = 20; cap = ⌈1.25 · 21 / 4⌉ = ⌈6.5625⌉ = 7: L + 1 ≤ 7 keeps 0, 4, 5
    v = view((0, 0, 0, 0), (3, 1, 0, 0), (5, 0, 0, 0), (8, 3, 0, 0))
    assert BoundedLoadGuard().narrow(req(prompt_len=64, max_tokens=8), v, np.arange(4)).keep.tolist() == [True, True, True, False]
    # on a subset the mean is the candidates': 5 and 11 → cap ⌈1.25 · 17 / 2⌉ = 11: 5 only
    assert BoundedLoadGuard().narrow(req(prompt_len=64, max_tokens=8), v, np.array([2, 3])).keep.tolist() == [True, False]
    # loaded alike (overload): all stay, affinity decides
    same = view(*[(60, 40, 200_000, 0)] * 4)
    assert BoundedLoadGuard().narrow(req(prompt_len=64, max_tokens=8), same, np.arange(4)).keep.all()


@settings(max_examples=300, deadline=None)
@given(loads=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1, max_size=64),
       c=st.floats(1.0, 3.0))
def test_bounded_load_never_empties_and_keeps_the_least_loaded(loads, c):
    v = view(*[(r, w, 0, 0) for r, w in loads])
    keep = BoundedLoadGuard(c).narrow(req(prompt_len=64, max_tokens=8), v, np.arange(v.n)).keep
    load = np.array([r + w for r, w in loads])
    assert keep[load.argmin()]
    assert (load[keep] + 1 <= np.ceil(c * (load.sum() + 1) / len(load))).all()


def test_a_hot_prefix_is_replicated_once_its_holder_passes_the_bound():
    """Every request carries one hot system prompt that only w0 holds. Marginal latency alone
    keeps sending them to w0 (a cached token saves its prefill and the stall it would cause);
    the default sends them there until w0's load reaches c × the mean, then to another instance."""
    prefix = ids_chain(range(64))  # 1,024 tokens
    c = RouterCore(RouterConfig(stale_after_s=1.0))
    for k in range(4):
        c.on_heartbeat(hb(f"w{k}", running=2), 0.0)
    c.on_kv_events("w0", KVEventBatch(0.0, [BlockStored(prefix, None, [], BS)]), 0.0)
    routes = [c.route(req(prompt_len=1_100, chain=ids_chain(range(68)), max_tokens=8), 0.0) for _ in range(8)]
    # L = 2+2+2+2 → w0 (cap ⌈1.25·9/4⌉ = 3); 3,2,2,2 → cap ⌈3.125⌉ = 4: w0 again; 4,2,2,2 → cap
    # ⌈3.4375⌉ = 4, w0 is out: w1 recomputes the prompt (hit 0) and then holds it (hit 1,088)
    assert [r.worker_id for r in routes] == ["w0", "w0", "w1", "w1", "w0", "w1", "w2", "w2"]
    assert [r.hit_tokens for r in routes] == [1024, 1024, 0, 1088, 1024, 1088, 0, 1088]
    bare = RouterCore(RouterConfig(stale_after_s=1.0))
    bare.pipeline.guards = [g for g in bare.pipeline.guards if not isinstance(g, BoundedLoadGuard)]
    for k in range(4):
        bare.on_heartbeat(hb(f"w{k}", running=2), 0.0)
    bare.on_kv_events("w0", KVEventBatch(0.0, [BlockStored(prefix, None, [], BS)]), 0.0)
    assert {bare.route(req(prompt_len=1_100, chain=ids_chain(range(68)), max_tokens=8), 0.0).worker_id for _ in range(8)} == {"w0"}
