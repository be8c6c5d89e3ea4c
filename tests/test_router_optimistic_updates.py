"""Between two heartbeats the router counts what it routed itself: a choice adds to its
worker's waiting requests and queued prefill until the worker's next heartbeat replaces the
guess; a refused choice adds nothing."""

from __future__ import annotations

from tokenyard.services.router.fleet import FleetView

from tests.builders import hb, req
from tests.router_fakes import router


def test_note_routed_is_optimistic_until_the_next_heartbeat():
    v = FleetView()
    v.upsert(hb("w0", running=2, waiting=1, queued=30), 0.0)
    v.upsert(hb("w1"), 0.0)
    v.note_routed(0, 100)
    v.note_routed(1, 7)
    v.note_routed(0, 50)
    assert (int(v.waiting[0]), float(v.queued_prefill[0]), int(v.last_chosen[0])) == (3, 180.0, 2)
    assert (int(v.waiting[1]), float(v.queued_prefill[1]), int(v.last_chosen[1])) == (1, 7.0, 1)
    assert v.decisions == 3
    v.upsert(hb("w0", running=3, waiting=0, queued=0), 0.1)  # the truth replaces the guess
    assert (int(v.waiting[0]), float(v.queued_prefill[0]), int(v.running[0])) == (0, 0.0, 3)
    assert int(v.last_chosen[0]) == 2  # the routing history is the router's own, kept


def test_least_loaded_picks_the_minimum_and_spreads_optimistically():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0", running=2, waiting=0), 0.0)
    r.on_heartbeat(hb("w1", running=0, waiting=0), 0.0)
    r.on_heartbeat(hb("w2", running=1, waiting=3), 0.0)
    picks = [r.route(req(f"q{k}", prompt_len=10), 0.0).worker_id for k in range(5)]
    # loads 2,0,4 → w1(1) → w1(2) ties w0(2): w0 never chosen → w0(3) ... w1(3) vs w0(3): w1 chosen longer ago
    assert picks == ["w1", "w1", "w0", "w1", "w0"]
    assert [int(x) for x in r.view.waiting[:3]] == [2, 3, 3]
    assert [float(x) for x in r.view.queued_prefill[:3]] == [20.0, 30.0, 0.0]


def test_route_with_exclude_after_a_refusal():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1", running=1), 0.0)
    assert r.route(req(), 0.0, exclude=frozenset({"w0"})).worker_id == "w1"
    assert r.route(req(), 0.0, exclude=frozenset({"w0", "w1"})).reason == "every candidate refused"
    assert [int(x) for x in r.view.waiting[:2]] == [0, 1]  # a refused choice updated nothing
