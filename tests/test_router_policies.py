"""Every routing policy: one conformance suite (hypothesis over random fleets), then exact
values on constructed fleets — the multiplicative score and its tie-breaks, and each peer's
published rule (Dynamo, llm-d, llm-d token-load, SGLang)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.core import POLICIES, RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import TREE_BLOCKS, Scored
from tokenyard.services.router.policies.dynamo import DynamoScorer, SoftmaxPicker
from tokenyard.services.router.policies.llmd import LlmdWeightedScorer
from tokenyard.services.router.policies.sglang import SglangCacheAwareScorer
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import BlockStored, KVEventBatch, MacroState

from tests.builders import hb, req

MODEL = "m"
BS = 16


def cache(core: RouterCore, wid: str, chain) -> None:
    ev = BlockStored(block_hashes=list(chain), parent_block_hash=None, token_ids=[], block_size=BS)
    core.on_kv_events(wid, KVEventBatch(0.0, [ev]), 0.0)


def core(policy: str, **kw) -> RouterCore:
    return RouterCore(RouterConfig(policy=policy, stale_after_s=1.0, **kw))


def chain(n, base=0):
    return ids_chain(range(base, base + n))


# ───────────────────────────── conformance ─────────────────────────────

workers = st.lists(
    st.tuples(
        st.integers(0, 40),  # running
        st.integers(0, 10),  # waiting
        st.integers(0, 50_000),  # queued prefill
        st.integers(0, 900),  # kv used
        st.integers(0, 12),  # cached blocks of the shared chain
        st.booleans(),  # healthy
        st.booleans(),  # accepting
        st.booleans(),  # publishes KV events
    ),
    min_size=1,
    max_size=6,
)
requests = st.lists(
    st.tuples(st.integers(1, 400), st.integers(0, 3), st.sets(st.integers(0, 5), max_size=2)),
    min_size=1,
    max_size=6,
)


def build(policy: str, fleet) -> RouterCore:
    c = core(policy)
    shared = chain(12)
    for k, (running, waiting, queued, used, cached, healthy, _accepting, events) in enumerate(fleet):
        c.on_heartbeat(hb(f"w{k}", running=running, waiting=waiting, queued=queued, used=used, free=1000 - used, healthy=healthy), 0.0)
        if events:
            cache(c, f"w{k}", shared[:cached])
    c.on_macro_state(MacroState("m", "nodg", [f"w{k}" for k in range(len(fleet))], {},
                                [f"w{k}" for k, f in enumerate(fleet) if f[6]], 1, 0.0))  # fmt: skip
    return c


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=40, deadline=None)
@given(fleet=workers, reqs=requests)
def test_every_policy_conforms(policy, fleet, reqs):
    """A choice is an eligible worker (healthy, accepting, not excluded) whenever one exists;
    the decision's inputs describe the chosen row as it was; the same inputs give the same
    choices."""
    a, b = build(policy, fleet), build(policy, fleet)
    shared = chain(12)
    for n, (blocks, prio, excluded) in enumerate(reqs):
        r = req(f"q{n}", prompt_len=blocks * 11, chain=shared[: (blocks * 11) // BS], priority=prio)
        exclude = frozenset(f"w{k}" for k in excluded)
        eligible = {f"w{k}" for k, f in enumerate(fleet) if f[5] and f[6]} - exclude
        v = a.view
        before = {w: (float(v.queued_prefill[i]), int(v.bs[i])) for w, i in v.slot.items()}
        ca, cb = a.route(r, 0.5, exclude), b.route(r, 0.5, exclude)
        assert (ca.worker_id, ca.score, ca.p_tokens, ca.hit_tokens) == (
            cb.worker_id,
            cb.score,
            cb.p_tokens,
            cb.hit_tokens,
        )
        if not eligible:
            assert ca.worker_id is None and ca.reason
            continue
        assert ca.worker_id in eligible
        assert ca.policy in (policy, "round-robin")
        assert 1 <= ca.candidates <= len(eligible)
        assert 0 <= ca.hit_tokens <= r.prompt_len and ca.hit_tokens % BS == 0
        queued, bs = before[ca.worker_id]
        assert ca.p_tokens == queued + max(r.prompt_len - ca.hit_tokens, 1)
        assert ca.batch_size == bs
        assert np.isfinite(ca.score)


rows = st.lists(
    st.tuples(
        st.integers(0, 300),  # running
        st.integers(0, 50),  # waiting
        st.integers(0, 10**6),  # queued prefill
        st.integers(0, 5000),  # kv used
        st.integers(0, 5000),  # kv free
        st.integers(0, 64),  # cached blocks of the request
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=60, deadline=None)
@given(fleet=rows, keep=st.lists(st.booleans(), min_size=8, max_size=8), prompt=st.integers(1, 1100))
def test_every_scorer_guard_and_picker_conforms(policy, fleet, keep, prompt):
    """On any fleet and any candidate subset: guards keep a non-empty subset, scorers give one
    finite score per candidate (and a finite tiebreak if any), the picker picks a candidate,
    and an argmin picker one with the lowest score."""
    spec = POLICIES[policy](RouterConfig(policy=policy), np.random.default_rng(0))
    v = view_of(*[(r, w, q, u, f, min(h * BS, prompt)) for r, w, q, u, f, h in fleet])
    n = v.n
    v.new[:n] = np.maximum(prompt - v.hit[:n], 1)
    v.p[:n] = v.queued_prefill[:n] + v.new[:n]
    if TREE_BLOCKS in spec.scorer.inputs:
        v.tree_blocks[:n] = np.arange(n, dtype=np.int64)[::-1]
    cand = np.flatnonzero(np.array(keep[:n])) if any(keep[:n]) else np.arange(n)
    r = req(prompt_len=prompt)
    for g in spec.guards:
        mask, _ = g.narrow(r, v, cand)
        assert mask.shape == cand.shape and mask.any()
        cand = cand[mask]
    scores, tb, _ = spec.scorer.score(r, v, cand)
    scores = np.asarray(scores, dtype=np.float64)
    assert scores.shape == cand.shape and np.isfinite(scores).all()
    assert tb is None or (tb.shape == cand.shape and np.isfinite(tb).all())
    k = spec.picker.pick(v, cand, scores, tb)
    assert k in cand.tolist()
    if not isinstance(spec.picker, SoftmaxPicker) or spec.picker.temperature == 0:
        assert scores[cand.tolist().index(k)] == scores.min()


def test_a_worker_without_kv_events_is_predicted_and_one_with_them_is_not():
    c = core("multiplicative")
    c.on_heartbeat(hb("quiet"), 0.0)
    c.on_heartbeat(hb("talks", running=50), 0.0)
    cache(c, "talks", [])
    r = req(prompt_len=64, chain=chain(4))
    assert c.route(r, 0.0).worker_id == "quiet"
    assert c.index.holders_of(chain(4)[3]) == ["quiet"]  # predicted, until the TTL runs out
    c.on_heartbeat(hb("quiet", running=1), 1.0)
    assert c.route(r, 1.0).hit_tokens == 64
    assert c.housekeeping(0.5 + 120.0) == ["quiet", "talks"]  # silent for a minute: rows and index go
    assert c.index.holders_of(chain(4)[0]) == [] and c.index.slot_of == {}
    precise = core("multiplicative", index_mode="precise")
    precise.on_heartbeat(hb("quiet"), 0.0)
    precise.route(r, 0.0)
    assert len(precise.index) == 0
    c.on_kv_events("ghost", KVEventBatch(0.0, [BlockStored(block_hashes=[1], parent_block_hash=None,
                                                           token_ids=[], block_size=BS)]), 200.0)  # fmt: skip
    assert c.housekeeping(200.0 + 60.0) == []
    assert list(c.index.slot_of) == ["ghost"]  # events only, no heartbeat: kept for forget_after_s
    assert c.housekeeping(200.0 + 60.1) == [] and c.index.slot_of == {}
    approx = core("multiplicative", index_mode="approximate")
    approx.on_heartbeat(hb("talks"), 0.0)
    cache(approx, "talks", chain(4))  # events are ignored in approximate mode
    assert len(approx.index) == 0


# ───────────────────────────── multiplicative ─────────────────────────────


def test_the_best_cached_instance_goes_elsewhere_when_its_prefill_queue_is_long():
    c = core("multiplicative")
    c.on_heartbeat(hb("cached", running=40, queued=8000), 0.0)
    c.on_heartbeat(hb("other", running=2), 0.0)
    cache(c, "cached", chain(64))
    cache(c, "other", [])  # publishes KV events: nothing predicted for it
    ch = c.route(req(prompt_len=1024, chain=chain(64)), 0.0)
    # cached: P = 8000 + 1, BS + 1 = 41 → 328,041; other: P = 1024, BS + 1 = 3 → 3,072
    assert (ch.worker_id, ch.score, ch.p_tokens, ch.batch_size, ch.hit_tokens) == (
        "other",
        3072.0,
        1024.0,
        2,
        0,
    )
    c.on_heartbeat(hb("cached", running=40, queued=0), 0.1)
    c.on_heartbeat(hb("other", running=2), 0.1)
    ch = c.route(req(prompt_len=1024, chain=chain(64)), 0.1)
    # with its prefill queue empty the full hit wins: P = 1, 1 × 41 = 41 < 3,072
    assert (ch.worker_id, ch.score, ch.p_tokens, ch.batch_size, ch.hit_tokens) == (
        "cached",
        41.0,
        1.0,
        40,
        1024,
    )


def test_an_idle_uncached_instance_does_not_win_a_tiny_fully_cached_request():
    for policy, want, score in (("multiplicative", "busy", 9.0), ("multiplicative-exact", "idle", 0.0)):
        c = core(policy)
        c.on_heartbeat(hb("busy", running=8), 0.0)
        c.on_heartbeat(hb("idle"), 0.0)
        cache(c, "busy", chain(2))
        ch = c.route(req(prompt_len=32, chain=chain(2)), 0.0)
        # busy: P = max(32 − 32, 1) = 1, × (8 + 1) = 9; idle: P = 32, × (0 + 1) = 32 (exact: × 0 = 0)
        assert (ch.worker_id, ch.score) == (want, score), policy


def test_score_ties_break_on_p_then_recency():
    c = core("multiplicative")
    c.on_heartbeat(hb("a", queued=100), 0.0)  # P = 200, BS + 1 = 1 → 200
    c.on_heartbeat(hb("b", running=1), 0.0)  # P = 100, BS + 1 = 2 → 200
    ch = c.route(req(prompt_len=100), 0.0)
    assert (ch.worker_id, ch.score, ch.p_tokens) == ("b", 200.0, 100.0)


def test_optimistic_updates_spread_requests_between_heartbeats():
    c = core("multiplicative")
    c.on_heartbeat(hb("a"), 0.0)
    c.on_heartbeat(hb("b"), 0.0)
    picks = [c.route(req(f"q{k}", prompt_len=100), 0.0) for k in range(4)]
    # a: 100 → (200, BS 1) 400; b: 100 → tie at 400 and P 200: a chosen longer ago
    assert [(p.worker_id, p.score) for p in picks] == [("a", 100.0), ("b", 100.0), ("a", 400.0), ("b", 400.0)]
    assert c.view.bs[:2].tolist() == [2, 2] and c.view.queued_prefill[:2].tolist() == [200.0, 200.0]
    c.on_heartbeat(hb("a", running=1), 0.1)  # the truth replaces the guess
    assert (int(c.view.bs[0]), float(c.view.queued_prefill[0])) == (1, 0.0)


def test_log_smoothing_compresses_p_above_its_threshold():
    from tokenyard.services.router.policies.multiplicative import smooth

    p = np.array([100.0, 1000.0, 1000.0 * np.e, 1000.0 * np.e**2])
    assert smooth(p, None) is p
    assert np.allclose(smooth(p, 1000.0), [100.0, 1000.0, 2000.0, 3000.0])


def test_the_batch_size_cap_filters_full_instances():
    c = core("multiplicative", bs_cap=4)
    c.on_heartbeat(hb("full", running=4), 0.0)
    c.on_heartbeat(hb("open", running=3, queued=50_000), 0.0)
    assert c.route(req(prompt_len=10), 0.0).worker_id == "open"
    ch = c.route(req(prompt_len=10), 0.0)  # open is at 4 now (optimistically)
    assert (ch.worker_id, ch.reason) == (None, "no candidate passed filter 'bs-cap'")


# ───────────────────────────── the peers ─────────────────────────────


def view_of(*rows) -> FleetView:
    v = FleetView()
    for k, (running, waiting, queued, used, free, hit) in enumerate(rows):
        v.upsert(hb(f"w{k}", running=running, waiting=waiting, queued=queued, used=used, free=free), 0.0)
        v.hit[k] = hit
    return v


def test_dynamo_cost_in_blocks():
    v = view_of((0, 0, 32, 100, 900, 32), (0, 0, 0, 10, 990, 0))
    cost = DynamoScorer().score(req(prompt_len=64), v, np.array([0, 1])).scores
    # w0: max(32/16 + 64/16 − 2, 0) + 100 + 4 = 108;  w1: (0 + 4 − 0) + 10 + 4 = 18
    assert cost.tolist() == [108.0, 18.0]
    assert DynamoScorer(prefill_load_scale=2.0, overlap_credit=0.5).score(
        req(prompt_len=64), v, np.array([0, 1])
    ).scores.tolist() == [
        2 * 5 + 104,
        2 * 4 + 14,
    ]


def test_dynamo_softmax_picker_is_seeded_and_argmin_at_zero():
    v = view_of((0, 0, 0, 0, 1, 0), (0, 0, 0, 0, 1, 0), (0, 0, 0, 0, 1, 0))
    cand, scores = np.array([0, 1, 2]), np.array([10.0, 11.0, 30.0])
    assert SoftmaxPicker(0.0, np.random.default_rng(0)).pick(v, cand, scores) == 0
    picks = [SoftmaxPicker(0.5, np.random.default_rng(7)).pick(v, cand, scores) for _ in range(1)]
    p1 = SoftmaxPicker(0.5, np.random.default_rng(7))
    p2 = SoftmaxPicker(0.5, np.random.default_rng(7))
    seq1 = [p1.pick(v, cand, scores) for _ in range(200)]
    assert seq1 == [p2.pick(v, cand, scores) for _ in range(200)] and seq1[0] == picks[0]
    # normalised costs 0, 0.05, 1 at T = 0.5: weights 1, e^-0.1, e^-2 → the worst is drawn least
    assert seq1.count(2) < seq1.count(1) and seq1.count(2) < seq1.count(0) and set(seq1) == {0, 1, 2}


def test_llmd_weighted_scorers():
    # prefix 1.0 / 0 / 0.5; queue (waiting 4, 0, 2) → 0 / 1 / 0.5; KV free share 0.5 / 0.9 / 1.0
    v = view_of((0, 4, 0, 50, 50, 64), (0, 0, 0, 10, 90, 0), (0, 2, 0, 0, 100, 32))
    assert np.allclose(LlmdWeightedScorer().score(req(prompt_len=64), v, np.array([0, 1, 2])).scores, [-4.0, -3.8, -4.5])
    # every queue equal: the queue scorer gives 1 to all
    v2 = view_of((0, 3, 0, 0, 100, 0), (0, 3, 0, 0, 100, 0))
    assert LlmdWeightedScorer().score(req(prompt_len=64), v2, np.array([0, 1])).scores.tolist() == [-4.0, -4.0]


@pytest.mark.parametrize(
    ("other_queued", "sticky_queued", "sticky_blocks", "want"),
    [
        (0, 10_000, 9, "w1"),  # 9 of 10 blocks cached, 0.63 s of backlog: sticky
        (0, 300_000, 9, "w0"),  # 18.8 s of backlog > 18 s: stickiness breaks, token load decides
        (100, 1_000, 5, "w0"),  # half cached is not sticky: the smaller token load wins
    ],
)
def test_llmd_token_load_sticky_until_saturated(other_queued, sticky_queued, sticky_blocks, want):
    c = core("llmd-token-load")
    c.on_heartbeat(hb("w0", queued=other_queued), 0.0)
    c.on_heartbeat(hb("w1", queued=sticky_queued), 0.0)
    cache(c, "w0", [])
    cache(c, "w1", chain(sticky_blocks))
    assert c.route(req(prompt_len=160, chain=chain(10)), 0.0).worker_id == want


def said(scored: Scored) -> tuple[list[float], str]:
    return scored.scores.tolist(), scored.note


def test_sglang_balance_then_cache_then_smallest_tree():
    s = SglangCacheAwareScorer()
    cand = np.array([0, 1])
    v = view_of((90, 10, 0, 0, 1, 64), (10, 0, 0, 0, 1, 0))  # loads 100 vs 10: imbalanced
    assert said(s.score(req(prompt_len=64), v, cand)) == ([100.0, 10.0], "balance")
    v = view_of((5, 5, 0, 0, 1, 32), (12, 0, 0, 0, 1, 0))  # match rate 0.5 > 0.3
    assert said(s.score(req(prompt_len=64), v, cand)) == ([-32.0, -0.0], "cache")
    v = view_of((5, 5, 0, 0, 1, 16), (12, 0, 0, 0, 1, 0))  # 0.25 ≤ 0.3: the smaller tree
    v.tree_blocks[:2] = [500, 20]
    assert said(s.score(req(prompt_len=64), v, cand)) == ([500.0, 20.0], "tree")


def test_sglang_through_the_core_uses_the_index_tree_sizes():
    c = core("sglang")
    for w in ("big", "small"):
        c.on_heartbeat(hb(w), 0.0)
    cache(c, "big", chain(50, base=1000))
    cache(c, "small", chain(5, base=2000))
    assert c.route(req(prompt_len=64, chain=chain(4)), 0.0).worker_id == "small"
    cache(c, "big", chain(4))
    assert c.route(req(prompt_len=64, chain=chain(4)), 0.0).worker_id == "big"
