"""bench/routing_decode_load.py: its numpy copy of the default (round 12's `q-rq0-half`) decides
as the router does, and its excess prices the decode load only beyond the fleet's mean."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from bench import routing_decode_load as dl


def test_the_copy_of_the_default_decides_as_the_router_does(monkeypatch):
    variant = "q-rq0-half"
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.services.router import core
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    monkeypatch.setattr(core, "POLICIES", dict(core.POLICIES))  # the registration ends with the test
    w = open_workload("chatbot", num_requests=150, rate_scale=2.0)
    runs = [simulate(w, SimConfig(instances=4, profile="a100-llama3-8b", policy=p), {"ttft": 2000.0, "tpot": 100.0})
            for p in (dl.register(variant), core.DEFAULT_POLICY)]
    keys = ("mean_ttft_ms", "p99_tpot_ms", "prefix_hit_ratio", "request_goodput", "duration")
    assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys]


def view():
    """Three candidates, nothing queued, every decode inside its slack (A = ∞): B = 6, 2, 1 →
    B̄ = 3; r holds 400 of its 1,000 tokens on row 0 only."""
    return SimpleNamespace(queued_prefill=np.zeros(3), new=np.array([600, 1000, 1000]),
                           hit=np.array([400, 0, 0]), load=np.array([6, 2, 1]), running=np.array([6, 2, 1]),
                           absorb=np.full(3, np.inf))


def test_the_excess_prices_the_absorbed_stall_beyond_the_mean_only():
    cand = np.arange(3)
    half = dl.Scorer(stall="half").score(None, view(), cand).scores
    # the slack absorbs every token: own + N·B̄/2 → 600 + 900, 1000 + 1500, 1000 + 1500
    assert half.tolist() == [1500.0, 2500.0, 2500.0]
    excess = dl.Scorer(stall="excess").score(None, view(), cand).scores
    # + N·max(0, B − B̄)/2: row 0 600·3/2 = 900; rows 1, 2 below the mean pay nothing
    assert excess.tolist() == [2400.0, 2500.0, 2500.0]
    # bexcess: the holder is r's only best holder, so the others pay at least its excess
    best = dl.Scorer(stall="bexcess").score(None, view(), cand).scores
    assert best.tolist() == [2400.0, 3400.0, 3400.0]
