"""The router's compiled kernels (services/router/kernels.py) against the numpy expressions they
replaced, bit for bit: every decision must stay what it was (the golden file pins 200 of them;
these properties pin the arithmetic on any fleet, ties, infinities and empty cases included)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router import kernels
from tokenyard.services.router.fleet import FleetView

# ── the numpy expressions as they were before the kernels (round 7's code) ──


def numpy_prefix_rows(blocks, n, block, plen, most, queued):
    if blocks is None:
        hit = np.zeros(n, dtype=np.int64)
        new = np.full(n, max(plen, 1), dtype=np.int64)
    else:
        hit = np.multiply(blocks, block)
        if most > plen:
            np.minimum(hit, plen, out=hit)
        new = np.subtract(plen, hit)
        if most >= plen:
            np.maximum(new, 1, out=new)
    return hit, new, queued[:n] + new


def numpy_bounded_load(load, queued, hit, new, cand, c, sticky):
    load = load[cand]
    cap = math.ceil(c * (int(np.add.reduce(load)) + 1) / len(cand))
    keep = load < cap
    if not sticky or np.count_nonzero(keep) == len(keep):
        return keep, False
    q = queued[cand]
    exempt = (hit[cand] > q) & ~keep
    if not exempt.any():
        return keep, False
    own = q + new[cand]
    exempt &= own <= own[keep].min()
    if not exempt.any():
        return keep, False
    return keep | exempt, True


def numpy_marginal_cost(new, queued, absorb, load, running, cand):
    n = new[cand]
    own = queued[cand] + n
    stalled = own - absorb[cand]
    np.maximum(stalled, 0.0, out=stalled)
    np.minimum(stalled, n, out=stalled)
    b = load[cand]
    cost = stalled * b
    cost += n * (int(np.add.reduce(b)) / len(b))
    cost /= 2.0
    cost += own
    # round 12's tie-break (bench.routing_ablation's `rq0`): ⌊own⌋, then fewer running
    # sequences among the candidates with nothing queued
    r = running[cand].astype(np.float64)
    tie = np.floor(own) + np.where(queued[cand] == 0, r / (r.max() + 1.0), 0.0)
    return cost, tie


def numpy_pick(ids, last_chosen, cand, scores, tiebreak):
    j = int(scores.argmin())
    tied = scores == scores[j]
    if np.count_nonzero(tied) == 1:
        return int(cand[j])
    if tiebreak is not None:
        tb = np.where(tied, tiebreak, np.inf)
        tied = tb == tb.min()
    best = cand[tied]
    if len(best) == 1:
        return int(best[0])
    lc = last_chosen[best]
    best = best[lc == lc.min()]
    return int(min(best, key=lambda i: ids[i]))


# ── fleets ──

absorbs = st.one_of(st.just(math.inf), st.just(0.0), st.floats(0.0, 50_000.0), st.floats(0.0, 1e12))


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 40))
    load = np.array(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)), dtype=np.int64)
    queued = np.array(draw(st.lists(st.integers(0, 40_000), min_size=n, max_size=n)), dtype=np.float64)
    hit = np.array(draw(st.lists(st.sampled_from([0, 0, 16, 512, 8_000, 60_000]), min_size=n, max_size=n)),
                   dtype=np.int64)
    plen = draw(st.integers(1, 70_000))
    new = np.maximum(plen - np.minimum(hit, plen), 1)
    absorb = np.array(draw(st.lists(absorbs, min_size=n, max_size=n)), dtype=np.float64)
    subset = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if any(subset) and not all(subset):
        cand = np.flatnonzero(subset)
    else:  # every row: the pipeline's read-only array
        cand = np.arange(n)
        cand.flags.writeable = False
    return load, queued, hit, new, absorb, cand


@settings(max_examples=400, deadline=None)
@given(fleet=fleets(), c=st.sampled_from([1.0, 1.25, 1.5, 3.0]), sticky=st.booleans())
def test_the_bounded_load_kernel_is_the_numpy_guard(fleet, c, sticky):
    load, queued, hit, new, _, cand = fleet
    keep, added = kernels.bounded_load(load, queued, hit, new, cand, c, sticky)
    want, want_added = numpy_bounded_load(load, queued, hit, new, cand, c, sticky)
    assert keep.tolist() == want.tolist() and added == want_added
    assert keep.any()


@settings(max_examples=400, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_the_marginal_cost_kernel_is_the_numpy_scorer_bit_for_bit(fleet, data):
    load, queued, _, new, absorb, cand = fleet
    n = len(load)
    running = np.array(data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)), dtype=np.int64)
    idle = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))  # rows with nothing queued
    queued = np.where(idle, 0.0, queued)
    cost, tie = kernels.marginal_cost(new, queued, absorb, load, running, cand)
    want_cost, want_tie = numpy_marginal_cost(new, queued, absorb, load, running, cand)
    # tolist compares Python floats: equal values, not within a tolerance
    assert cost.tolist() == want_cost.tolist() and tie.tolist() == want_tie.tolist()


def test_ties_on_own_ttft_go_to_fewer_running_sequences_where_nothing_is_queued():
    # own TTFT 640 on rows 0-2 (row 2 only through its queue), 641 on row 3
    new = np.array([640, 640, 600, 641], dtype=np.int64)
    queued = np.array([0.0, 0.0, 40.0, 0.0])
    running = np.array([5, 2, 0, 0], dtype=np.int64)
    _, tie = kernels.marginal_cost(new, queued, np.full(4, math.inf), np.ones(4, dtype=np.int64), running,
                                   np.arange(4))
    # max running 5: 640 + 5/6, 640 + 2/6; a queue takes no fraction; the fraction stays below 1
    assert tie.tolist() == [640.0 + 5 / 6, 640.0 + 2 / 6, 640.0, 641.0]


@settings(max_examples=400, deadline=None)
@given(
    scores=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    tiebreak=st.one_of(st.none(), st.lists(st.integers(0, 2), min_size=30, max_size=30)),
    chosen=st.lists(st.integers(-1, 3), min_size=30, max_size=30),
    names=st.permutations(range(30)),
)
def test_the_argmin_kernel_and_the_id_break_pick_as_the_numpy_picker(scores, tiebreak, chosen, names):
    m = len(scores)
    view = FleetView(capacity=30)
    view.ids = [f"w{k:02d}" for k in names]
    view.last_chosen[:30] = chosen
    cand = np.arange(0, 2 * m, 2) % 30 if m <= 15 else np.arange(m)
    s = np.asarray(scores, dtype=np.float64)
    tb = None if tiebreak is None else np.asarray(tiebreak[:m], dtype=np.float64)
    from tokenyard.services.router.pipeline import ArgminPicker

    assert ArgminPicker().pick(view, cand, s, tb) == numpy_pick(view.ids, view.last_chosen, cand, s, tb)


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(1, 40),
    block=st.sampled_from([1, 16, 32]),
    chain=st.integers(0, 200),
    plen=st.integers(0, 4_000),
    held=st.lists(st.integers(0, 200), min_size=40, max_size=40),
    none=st.booleans(),
)
def test_the_prefix_rows_kernel_is_the_numpy_hit_new_p(n, block, chain, plen, held, none):
    queued = np.arange(40, dtype=np.float64) * 7.5
    blocks = None if none else np.minimum(np.asarray(held[:n], dtype=np.int64), chain)
    most = chain * block
    hit, new, p = np.zeros(40, np.int64), np.zeros(40, np.int64), np.zeros(40)
    kernels.prefix_rows(np.empty(0, np.int64) if blocks is None else blocks, n, block, plen, most, queued, hit, new, p)
    want_hit, want_new, want_p = numpy_prefix_rows(blocks, n, block, plen, most, queued)
    assert hit[:n].tolist() == want_hit.tolist()
    assert new[:n].tolist() == want_new.tolist()
    assert p[:n].tolist() == want_p.tolist()


def test_a_nan_cost_stays_nan_so_the_pipeline_refuses_it():
    one = np.ones(1, dtype=np.int64)
    cost, _ = kernels.marginal_cost(one, np.zeros(1), np.array([math.nan]), one, one, np.arange(1))
    assert math.isnan(cost[0])  # np.maximum / np.minimum propagate it: the kernel does too


def test_the_kernels_load_once_and_are_bound_in_the_module():
    kernels.load()
    first = kernels.marginal_cost
    kernels.load()
    assert kernels.marginal_cost is first
    assert all(hasattr(kernels, name) for name in kernels.KERNELS)


@settings(max_examples=300, deadline=None)
@given(slots=st.integers(1, 300), runs=st.lists(st.tuples(st.integers(1, 2**300), st.integers(1, 10_000)),
                                                 min_size=1, max_size=5, unique_by=lambda r: r[0]))
def test_the_runs_kernel_is_round_7s_unpacked_product(slots, runs):
    size, nbytes = slots + 1, (slots + 8) // 8
    runs = {mask & ((1 << slots) - 1) or 1: count for mask, count in runs}
    masks = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m in runs), np.uint8)
    counts = np.fromiter(runs.values(), np.int64, len(runs))
    bits = np.unpackbits(masks, bitorder="little").reshape(len(runs), 8 * nbytes)
    want = counts @ bits[:, :size]  # round 7's _counts
    assert kernels.spread_runs(masks, counts, size).tolist() == want.tolist()
