"""Placement: the retry loop the router shell and the simulator share — a refusing worker
is excluded and the core asked again, up to ROUTE_ATTEMPTS offers."""

from __future__ import annotations

from tokenyard.services.router.core import ROUTE_ATTEMPTS, Placement, RouterConfig, RouterCore

from tests.builders import hb, req


def core_with(*workers: str) -> RouterCore:
    core = RouterCore(RouterConfig(policy="round-robin"))
    for w in workers:
        core.on_heartbeat(hb(w), 0.0)
    return core


def test_refused_workers_are_excluded_until_attempts_run_out():
    p = Placement(core_with("a", "b", "c", "d"), req())
    offered = []
    while (choice := p.next(0.0)) is not None:
        offered.append(choice.worker_id)
        p.refused(choice.worker_id, "full")
    assert ROUTE_ATTEMPTS == 3
    assert offered == ["a", "b", "c"]
    assert p.reason == "c refused: full"


def test_no_candidate_left_ends_with_the_core_reason():
    p = Placement(core_with("a"), req())
    assert p.next(0.0).worker_id == "a"
    p.refused("a", "draining")
    assert p.next(0.0) is None
    assert p.reason == "every candidate refused"


def test_an_accepted_first_offer_needs_one_attempt():
    p = Placement(core_with("a", "b"), req(), attempts=1)
    assert p.next(0.0).worker_id == "a"
    assert p.next(0.0) is None and p.reason == ""
