"""The overload pathology of P × (BS + 1) and the prefill-budget guard that prevents it.

1. A snapshot: the exact scores that send a long prompt to the instance with the longest
   prefill queue (its few running sequences make the product small), and the guard's choice.
2. A constructed fleet: four simulated A100 instances (the real SimEngineCore, a100-llama3-8b
   profile) on a virtual clock, fed by RouterCore through heartbeats and KV events, under
   about three times the load they can serve (20 % 8k-token prompts, 80 % 200-token ones).
   Unguarded, the product sorts requests by size — one instance takes most short prompts
   and almost no long ones, the long ones queue behind each other elsewhere — and the
   fleet needs far longer to serve the same work; with the guard the long prompts spread
   and the work finishes sooner, with a lower TTFT tail.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.guards import PrefillBudgetGuard
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared.schemas import Heartbeat, KVEventBatch

from tests import builders
from tests.builders import hb, req


def test_the_product_sends_a_long_prompt_to_the_longest_prefill_queue_and_the_guard_does_not():
    def route(policy, prompt_len):
        c = RouterCore(RouterConfig(policy=policy))
        c.on_heartbeat(hb("queued", running=2, queued=200_000), 0.0)  # long prompts waiting
        c.on_heartbeat(hb("busy", running=40, queued=5_000), 0.0)  # short ones decoding
        return c.route(req(prompt_len=prompt_len), 0.0)

    # queued: (200,000 + 30,000) × 3 = 690,000 < busy: (5,000 + 30,000) × 41 = 1,435,000
    c = route("multiplicative-unguarded", 30_000)
    assert (c.worker_id, c.score, c.over_budget) == ("queued", 690_000.0, False)
    # guarded: 5 s × 15,000 tokens/s = 75,000 tokens of budget; queued needs 230,000 → out
    c = route("multiplicative", 30_000)
    assert (c.worker_id, c.score, c.p_tokens, c.over_budget) == ("busy", 1_435_000.0, 35_000.0, False)
    # a short prompt goes to busy either way: (200,100) × 3 = 600,300 > (5,100) × 41 = 209,100
    assert (
        route("multiplicative-unguarded", 100).worker_id == route("multiplicative", 100).worker_id == "busy"
    )


def test_over_budget_everywhere_keeps_the_queues_near_the_shortest():
    v = FleetView()
    for k, queued in enumerate((100_000, 120_000, 140_000, 90_000)):
        v.upsert(hb(f"w{k}", queued=queued), 0.0)
    v.new[:4] = 1_000
    v.p[:4] = v.queued_prefill[:4] + 1_000
    g = PrefillBudgetGuard(prefill_tokens_per_s=10_000.0, slack=0.25)
    cand = np.arange(4)
    # budgets P0…P3: 0.5 / 5 / 60 / 60 s → 5,000 / 50,000 / 600,000 tokens: P0, P1 are over everywhere
    # then keep P ≤ 1.25 × min P = 1.25 × 91,000 = 113,750 → w0 (101,000) and w3 (91,000)
    keep, note = g.narrow(req(prompt_len=1_000, priority=1), v, cand)
    assert (keep.tolist(), note) == ([True, False, False, True], "over-budget")
    keep, note = g.narrow(req(prompt_len=1_000, priority=2), v, cand)
    assert (keep.tolist(), note) == ([True] * 4, "")


# ───────────────────────────── the constructed fleet ─────────────────────────────


def run_fleet(policy: str, n: int = 4, seconds: float = 20.0, rate: float = 90.0, seed: int = 0) -> dict:
    """Poisson arrivals for `seconds`, then the fleet drains. Events on one virtual clock:
    arrivals (routed at once), heartbeats and KV events every 100 ms, engine steps."""
    rng = np.random.default_rng(seed)
    engines = [SimEngineCore(profile("a100-llama3-8b"), 16) for _ in range(n)]
    ids = [f"w{i}" for i in range(n)]
    core = RouterCore(RouterConfig(policy=policy, stale_after_s=1.0))
    heap: list[tuple[float, int, int]] = []  # (time, kind 0 hb / 1 arrival / 2 step done, index)
    t, k = 0.0, 0
    while (t := t + rng.exponential(1.0 / rate)) < seconds:
        heap.append((t, 1, k))
        k += 1
    heap += [(j * 0.1, 0, j) for j in range(int(seconds / 0.1) + 1)]
    heapq.heapify(heap)
    busy_until = [0.0] * n
    routed = {w: {"long": 0, "short": 0} for w in ids}
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    longs: set[str] = set()
    while heap:
        now, kind, x = heapq.heappop(heap)
        if kind == 0:
            for i, e in enumerate(engines):
                core.on_heartbeat(Heartbeat(ids[i], "m", x, now, e.stats()), now)
                core.on_kv_events(ids[i], KVEventBatch(now, e.pool.drain_events()), now)
        elif kind == 1:
            is_long = rng.random() < 0.2
            plen = 8000 if is_long else 200
            chain = rng.integers(-(2**62), 2**62, plen // 16).tolist()
            r = builders.req(f"r{x}", plen, 100, 1, chain=chain, arrival_s=now, reply_to="")
            c = core.route(r, now)
            i = ids.index(c.worker_id)
            engines[i].add(r)
            routed[c.worker_id]["long" if is_long else "short"] += 1
            arrival[r.request_id] = now
            if is_long:
                longs.add(r.request_id)
            if busy_until[i] <= now:
                heapq.heappush(heap, (now, 2, i))
        elif engines[x].has_work():
            res = engines[x].step()
            busy_until[x] = now + res.duration_s
            for o in res.outputs:
                first.setdefault(o.request_id, busy_until[x])
            heapq.heappush(heap, (busy_until[x], 2, x))
    assert set(first) == set(arrival)  # every request got its first token
    ttft = {r: first[r] - arrival[r] for r in arrival}
    n_long = len(longs)
    return {
        "routed": routed,
        "long_share": [routed[w]["long"] / n_long for w in ids],
        "short_share": [routed[w]["short"] / (len(arrival) - n_long) for w in ids],
        "makespan_s": max(busy_until),
        "long_ttft_s": float(np.mean([ttft[r] for r in longs])),
        "p99_ttft_s": float(np.percentile(list(ttft.values()), 99)),
    }


@pytest.fixture(scope="module")
def overload():
    return {p: run_fleet(p) for p in ("multiplicative-unguarded", "multiplicative")}


def test_unguarded_the_product_sorts_requests_by_size(overload):
    bare = overload["multiplicative-unguarded"]
    # one instance takes most of the short prompts and almost none of the long ones
    sorter = int(np.argmax(bare["short_share"]))
    assert bare["short_share"][sorter] > 0.6
    assert bare["long_share"][sorter] < 0.05


def test_the_guard_spreads_long_prompts_and_serves_the_same_work_sooner(overload):
    bare, guarded = overload["multiplicative-unguarded"], overload["multiplicative"]
    # every instance takes at least half its fair share (1/4) of the long prompts
    assert min(guarded["long_share"]) > 0.125 > min(bare["long_share"])
    assert max(guarded["short_share"]) < max(bare["short_share"]) - 0.2
    # the same requests are served in much less time (throughput), long prompts wait less
    assert guarded["makespan_s"] < 0.85 * bare["makespan_s"]
    assert guarded["long_ttft_s"] < 0.85 * bare["long_ttft_s"]
    assert guarded["p99_ttft_s"] < 0.85 * bare["p99_ttft_s"]
