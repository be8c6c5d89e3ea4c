"""The policy registry and the two baseline scorers: round-robin (score = when last chosen)
and least-loaded (score = running + waiting)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenyard.services.router.core import POLICIES, RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.policies.least_loaded import LeastLoadedScorer
from tokenyard.services.router.policies.round_robin import RoundRobinScorer

from tests.builders import hb, req
from tests.router_fakes import router


def test_policies_registry():
    assert list(POLICIES) == [
        "multiplicative",
        "multiplicative-exact",
        "multiplicative-unguarded",
        "marginal-latency",
        "dynamo",
        "llmd",
        "llmd-token-load",
        "sglang",
        "least-loaded",
        "round-robin",
    ]
    assert RouterConfig().policy == "marginal-latency"
    with pytest.raises(
        ValueError, match="unknown policy 'best'; known: multiplicative, multiplicative-exact"
    ):
        router("best")
    with pytest.raises(ValueError, match="unknown index mode 'x'; known: auto, precise, approximate"):
        RouterCore(RouterConfig(index_mode="x"))


def test_round_robin_cycles_all_healthy_workers():
    r = router("round-robin")
    for w in ("w2", "w0", "sick", "w1"):
        r.on_heartbeat(hb(w, running=10 if w == "w0" else 0, healthy=w != "sick"), 0.0)
    picks = [r.route(req(f"q{k}"), 0.5).worker_id for k in range(7)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2", "w0"]


def test_round_robin_takes_a_new_worker_next():
    r = router("round-robin")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1"), 0.0)
    assert [r.route(req(), 0.0).worker_id for _ in range(3)] == ["w0", "w1", "w0"]
    r.on_heartbeat(hb("w9"), 0.0)
    assert [r.route(req(), 0.0).worker_id for _ in range(4)] == ["w9", "w1", "w0", "w9"]


def test_round_robin_scores_are_last_chosen():
    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.0)
    v.note_routed(1, 0)
    assert RoundRobinScorer().score(req(), v, np.array([0, 1])).scores.tolist() == [-1.0, 0.0]


def test_least_loaded_scores_running_plus_waiting():
    v = FleetView()
    v.upsert(hb("w0", running=3, waiting=2), 0.0)
    v.upsert(hb("w1", running=4, waiting=0), 0.0)
    v.upsert(hb("w2", running=0, waiting=9), 0.0)
    assert LeastLoadedScorer().score(req(), v, np.array([0, 1, 2])).scores.tolist() == [5.0, 4.0, 9.0]
    assert LeastLoadedScorer().score(req(), v, np.array([2])).scores.tolist() == [9.0]
