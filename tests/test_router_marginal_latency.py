"""The default policy, marginal latency: exact costs, the router's default, affinity that
survives overload where the guarded product drops it, and monotonicity as a property."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tokenyard.services.router.core import DEFAULT_POLICY, POLICIES, RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.policies.latency import BoundedLoadGuard, MarginalLatencyScorer, exempt_cost
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


def slack_view(*rows, per_token: float = 0.1) -> FleetView:
    """rows: (running, waiting, queued, TPOT slack ms or None: nothing decodes)."""
    v = FleetView()
    for k, (running, waiting, queued, slack) in enumerate(rows):
        v.upsert(hb(f"w{k}", running=running, waiting=waiting, queued=queued, tpot_slack_ms=slack,
                    prefill_ms_per_token=per_token), 0.0)
    return v


def test_exact_costs_with_decode_slack():
    """The stall's fleet half, n · B̄ / 2, counts whole; its instance half only for the tokens
    i's decodes cannot absorb within their TPOT slack once i's queue has run:
    A_i = max(0, S_i / t_i − Q_i), t_i = 0.1 ms a token."""
    # B = 2, 1, 6 → B̄ = 3; new = 128, 640, 640 (as in test_exact_costs)
    v = prepared(slack_view((2, 0, 1000, 150.0), (0, 1, 0, None), (4, 2, 200, 20.0)), 640, [512, 0, 0])
    scored = MarginalLatencyScorer().score(req(prompt_len=640), v, np.arange(3))
    # w0: A = 1500 − 1000 = 500 ≥ 128: 1128 + 128·3/2 = 1320;  w1: nothing decodes (A = ∞):
    # 640 + 640·3/2 = 1600;  w2: A = max(0, 200 − 200) = 0: 840 + 640·(3 + 6)/2 = 3720
    assert scored.scores.tolist() == [1320.0, 1600.0, 3720.0]
    assert scored.tiebreak.tolist() == [1128.0, 640.0, 840.0]
    # part absorbed: B = 2, 1 → B̄ = 1.5; w0 with 60 ms of slack, A = 600 − 500 = 100 → 28 of
    # its 128 tokens stall its 2 sequences: 628 + (128·1.5 + 28·2)/2 = 752; w1: 640 + 640·0.75
    v = prepared(slack_view((2, 0, 500, 60.0), (0, 1, 0, None)), 640, [512, 0])
    assert MarginalLatencyScorer().score(req(prompt_len=640), v, np.arange(2)).scores.tolist() == [752.0, 1120.0]
    # an engine that reports no prefill cost (not measured yet): its decodes absorb nothing,
    # last round's cost: 1128 + 128·(2 + 1.5)/2 = 1352; 640 + 640·(1 + 1.5)/2 = 1440
    v = prepared(slack_view((2, 0, 1000, 150.0), (0, 1, 0, 5.0), per_token=0.0), 640, [512, 0])
    assert MarginalLatencyScorer().score(req(prompt_len=640), v, np.arange(2)).scores.tolist() == [1352.0, 1440.0]


def test_the_rows_absorb_is_the_slack_in_prefill_tokens_kept_at_each_heartbeat():
    v = slack_view((2, 0, 0, 150.0), (0, 1, 0, None), (3, 0, 0, 0.0))
    assert v.absorb[: v.n].tolist() == [1500.0, math.inf, 0.0]
    v.upsert(hb("w0", running=2, tpot_slack_ms=30.0, prefill_ms_per_token=0.1), 1.0)  # the next heartbeat
    v.upsert(hb("w1", running=1, tpot_slack_ms=5.0), 1.0)  # no prefill cost reported: nothing absorbed
    assert v.absorb[: v.n].tolist() == [300.0, 0.0, 0.0]
    v.upsert(hb("w2", running=3, tpot_slack_ms=math.nan, prefill_ms_per_token=0.1), 1.0)  # broken: nothing absorbed
    assert v.absorb[2] == 0.0


slack_fleets = st.lists(
    st.tuples(st.integers(0, 64), st.integers(0, 64), st.integers(0, 300_000), st.integers(0, 8_000),
              st.none() | st.floats(0.0, 5_000.0)),
    min_size=2,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(fleet=slack_fleets, prompt=st.integers(1, 8_000))
def test_the_slack_only_lowers_the_stall_and_more_slack_never_costs_more(fleet, prompt):
    """own TTFT + the fleet's half of the stall ≤ cost ≤ the cost with no slack; and an
    instance with no more queued tokens, uncached tokens and sequences and no less slack than
    another never scores worse."""
    v = prepared(slack_view(*[(r, w, q, s) for r, w, q, _, s in fleet]), prompt, [min(h, prompt) for *_, h, _ in fleet])
    cand = np.arange(v.n)
    cost = MarginalLatencyScorer().score(req(prompt_len=prompt), v, cand).scores
    q, n, b = v.queued_prefill[: v.n], v.new[: v.n], v.running[: v.n] + v.waiting[: v.n]
    fleet_half = q + n + n * b.mean() / 2
    assert np.allclose(np.minimum(cost, fleet_half), fleet_half)
    assert np.allclose(np.maximum(cost, q + n + n * (b + b.mean()) / 2), q + n + n * (b + b.mean()) / 2)
    slack = np.array([np.inf if s is None else s for *_, s in fleet])
    for i in range(v.n):
        for j in range(v.n):
            if q[i] <= q[j] and n[i] <= n[j] and b[i] <= b[j] and slack[i] >= slack[j]:
                assert cost[i] <= cost[j]


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
    the default sends them there while w0 is within c × the mean or, beyond it, while the
    prefill queued on w0 is shorter than the 1,024 cached tokens (the sticky exemption), then
    to another instance, which then holds a copy."""
    prefix = ids_chain(range(64))  # 1,024 tokens
    c = RouterCore(RouterConfig(stale_after_s=1.0))
    for k in range(4):
        c.on_heartbeat(hb(f"w{k}", running=2), 0.0)
    c.on_kv_events("w0", KVEventBatch(0.0, [BlockStored(prefix, None, [], BS)]), 0.0)
    routes = [c.route(req(prompt_len=1_100, chain=ids_chain(range(68)), max_tokens=8), 0.0) for _ in range(16)]
    # each request queues its 76 new tokens on w0 (no heartbeat in between): the first two
    # are within the bound (L = 2, 3 against caps 3, 4); from the third on w0 is beyond it and
    # exempt while its queue 76·k < 1,024, i.e. for k ≤ 13; the 15th finds 1,064 queued and
    # goes to w1, which recomputes the prompt (hit 0) and then holds it (hit 1,088)
    assert [r.worker_id for r in routes] == ["w0"] * 14 + ["w1", "w1"]
    assert [r.hit_tokens for r in routes] == [1024] * 14 + [0, 1088]
    assert [("sticky" in r.notes) for r in routes[:3]] == [False, False, True]
    bare = RouterCore(RouterConfig(stale_after_s=1.0))
    bare.pipeline.guards = [g for g in bare.pipeline.guards if not isinstance(g, BoundedLoadGuard)]
    for k in range(4):
        bare.on_heartbeat(hb(f"w{k}", running=2), 0.0)
    bare.on_kv_events("w0", KVEventBatch(0.0, [BlockStored(prefix, None, [], BS)]), 0.0)
    assert {bare.route(req(prompt_len=1_100, chain=ids_chain(range(68)), max_tokens=8), 0.0).worker_id for _ in range(16)} == {"w0"}


# ───────────────────────────── the sticky exemption ─────────────────────────────


def test_a_conversation_stays_on_its_holder_a_little_over_the_bound():
    """L = 0, 4, 5, 11 → cap 7, w3 (11 sequences) is beyond it. w3 holds 7,000 of the 8,000
    tokens of r's conversation, nothing waits there and 500 tokens are queued: r's first token
    comes sooner there (500 + 1,000) than anywhere within the bound (8,000), and its cache
    outweighs its queue (7,000 > 500), so w3 is kept."""
    v = prepared(view((0, 0, 0, 0), (4, 0, 0, 0), (5, 0, 0, 0), (11, 0, 500, 0)), 8_000, [0, 0, 0, 7_000])
    narrowed = BoundedLoadGuard().narrow(req(prompt_len=8_000), v, np.arange(4))
    assert narrowed.keep.tolist() == [True, True, True, True] and narrowed.note == "sticky"
    assert BoundedLoadGuard(sticky=False).narrow(req(prompt_len=8_000), v, np.arange(4)).keep.tolist() == [True, True, True, False]


def test_no_exemption_where_r_would_wait():
    kept = [True, True, True, False]
    # more prefill queued ahead of r on the holder than r has cached there
    v = prepared(view((0, 0, 0, 0), (4, 0, 0, 0), (5, 0, 0, 0), (11, 0, 7_000, 0)), 8_000, [0, 0, 0, 7_000])
    assert BoundedLoadGuard().narrow(req(prompt_len=8_000), v, np.arange(4)).keep.tolist() == kept
    # r's first token would come sooner within the bound (w0 holds as much, with no queue)
    v = prepared(view((0, 0, 0, 0), (4, 0, 0, 0), (5, 0, 0, 0), (11, 0, 500, 0)), 8_000, [7_000, 0, 0, 7_000])
    assert BoundedLoadGuard().narrow(req(prompt_len=8_000), v, np.arange(4)).keep.tolist() == kept
    # nothing cached beyond the bound: no exemption, however idle its queue
    v = prepared(view((0, 0, 0, 0), (4, 0, 0, 0), (5, 0, 0, 0), (11, 0, 0, 0)), 8_000, [0, 0, 0, 0])
    assert BoundedLoadGuard().narrow(req(prompt_len=8_000), v, np.arange(4)).keep.tolist() == kept


holders = st.lists(  # (running, waiting, queued, hit): queues of the order of the hits
    st.tuples(st.integers(0, 64), st.integers(0, 8), st.integers(0, 9_000), st.integers(0, 8_000)),
    min_size=2,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(fleet=holders, prompt=st.integers(1, 8_000))
def test_an_exempt_instance_gives_r_its_soonest_first_token_and_caches_more_than_it_queues(fleet, prompt):
    v = prepared(view(*fleet), prompt, [min(h, prompt) for *_, h in fleet])
    cand = np.arange(v.n)
    bare = np.asarray(BoundedLoadGuard(sticky=False).narrow(req(prompt_len=prompt), v, cand).keep)
    keep = np.asarray(BoundedLoadGuard().narrow(req(prompt_len=prompt), v, cand).keep)
    assert (keep >= bare).all()  # the exemption only adds
    cost = exempt_cost(v.queued_prefill[: v.n], v.new[: v.n])
    event("exempt" if (keep & ~bare).any() else "none exempt")
    for i in np.flatnonzero(keep & ~bare):
        assert v.hit[i] > v.queued_prefill[i] and cost[i] <= cost[bare].min()
