"""The candidate filters every routing policy starts from (fresh and healthy, accepting, same
model), alone and through the core, and what a decision says when they leave no candidate."""

from __future__ import annotations

from tokenyard.services.router.filters import AcceptingFilter, HealthyFilter, ModelFilter
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import MacroState

from tests.builders import hb, req
from tests.router_fakes import FixedScorer, pipeline, router


def test_healthy_filter_drops_unhealthy_draining_and_stale():
    v = FleetView()
    v.upsert(hb("ok"), 9.5)
    v.upsert(hb("sick", healthy=False), 9.5)
    v.upsert(hb("draining", draining=True), 9.5)
    v.upsert(hb("stale"), 8.0)
    assert HealthyFilter(stale_after_s=1.0).keep(req(), v, 10.0).tolist() == [True, False, False, False]
    assert HealthyFilter(stale_after_s=2.0).keep(req(), v, 10.0).tolist() == [True, False, False, True]


def test_accepting_filter_follows_macro_states_and_does_not_alias():
    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.0)
    v.set_accepting("w1", False)
    mask = AcceptingFilter().keep(req(), v, 0.0)
    assert mask.tolist() == [True, False]
    mask[:] = False  # the pipeline and-s into it; the view must not change
    assert v.accepting[:2].tolist() == [True, False]


def test_model_filter_keeps_workers_of_the_requests_model():
    v = FleetView()
    v.upsert(hb("w0", model="a"), 0.0)
    v.upsert(hb("w1", model="b"), 0.0)
    v.upsert(hb("w2", model="a"), 0.0)
    assert ModelFilter().keep(req(model="a"), v, 0.0).tolist() == [True, False, True]
    assert ModelFilter().keep(req(model="zzz"), v, 0.0).tolist() == [False, False, False]


def test_stale_and_unhealthy_workers_are_never_chosen():
    r = router("least-loaded", stale=1.0)
    r.on_heartbeat(hb("stale"), 0.0)
    r.on_heartbeat(hb("draining", draining=True), 1.5)
    r.on_heartbeat(hb("busy", running=50), 1.5)
    assert {r.route(req(), 2.0).worker_id for _ in range(4)} == {"busy"}
    r.on_heartbeat(hb("busy", running=50, healthy=False), 2.0)
    c = r.route(req(), 2.0)
    assert (c.worker_id, c.reason) == (None, "no candidate passed filter 'healthy'")


def test_macro_state_gates_which_workers_accept():
    r = router("round-robin")
    for w in ("w0", "w1", "w2"):
        r.on_heartbeat(hb(w), 0.0)
    r.on_macro_state(MacroState("m0", "ecoserve", ["w0", "w1", "ghost"], {}, ["w1"], 1, 0.0))
    assert {r.route(req(), 0.0).worker_id for _ in range(4)} == {"w1", "w2"}
    r.on_macro_state(MacroState("m0", "ecoserve", ["w0", "w1"], {}, [], 2, 0.0))
    assert {r.route(req(), 0.0).worker_id for _ in range(3)} == {"w2"}


def test_route_filters_by_model():
    r = router("least-loaded")
    r.on_heartbeat(hb("a0", model="a", running=5), 0.0)
    r.on_heartbeat(hb("b0", model="b"), 0.0)
    assert r.route(req(model="a"), 0.0).worker_id == "a0"
    assert r.route(req(model="c"), 0.0).reason == "no candidate passed filter 'model'"


def test_no_workers_known():
    c = pipeline(FixedScorer({})).choose(req(), FleetView(), 0.0)
    assert (c.worker_id, c.reason, c.candidates) == (None, "no workers known", 0)


def test_the_filter_that_empties_the_candidates_is_named():
    v = FleetView()
    v.upsert(hb("w0", model="other"), 0.0)
    c = pipeline(FixedScorer({}), [HealthyFilter(1.0), ModelFilter()]).choose(req(), v, 0.5)
    assert (c.worker_id, c.reason) == (None, "no candidate passed filter 'model'")
    c = pipeline(FixedScorer({}), [HealthyFilter(1.0), ModelFilter()]).choose(req(), v, 5.0)
    assert c.reason == "no candidate passed filter 'healthy'"


def test_excluded_workers_are_not_candidates():
    v = FleetView()
    for w in ("w0", "w1", "w2"):
        v.upsert(hb(w), 0.0)
    p = pipeline(FixedScorer({"w0": 1.0, "w1": 2.0, "w2": 3.0}))
    c = p.choose(req(), v, 0.0, exclude=frozenset({"w0", "ghost"}))
    assert (c.worker_id, c.candidates) == ("w1", 2)
    c = p.choose(req(), v, 0.0, exclude=frozenset({"w0", "w1", "w2"}))
    assert (c.worker_id, c.reason) == (None, "every candidate refused")
