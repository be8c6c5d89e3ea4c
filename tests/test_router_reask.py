"""The router's re-ask memory (services/router/reask.py), driven without NATS: a request asked
again is answered from its one placement, never placed twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.reask import Answer, Place, ReaskMemory, Wait, key_of
from tokenyard.shared import schemas

from tests.builders import req
from tests.conftest import until

K = ("r1", "_INBOX.c.1", "")


def routed(worker: str, rid: str = "r1") -> schemas.RouteDecision:
    return schemas.RouteDecision(rid, schemas.Outcome.ROUTED, worker)


def test_the_first_ask_places_and_an_ask_during_the_placement_waits_for_its_decision():
    m: ReaskMemory[str] = ReaskMemory()
    assert m.ask(K, "first") == Place()
    assert m.ask(K, "second") == Wait()
    assert m.ask(K, "third") == Wait()
    assert m.settle(K, routed("w1")) == ["second", "third"]  # the first asker holds its own answer
    assert m.placing == {}


def test_an_ask_after_the_request_was_routed_is_answered_reoffered_to_the_same_worker():
    m: ReaskMemory[str] = ReaskMemory()
    m.ask(K, "a")
    m.settle(K, routed("w1"))
    got = m.ask(K, "b")
    assert got == Answer(schemas.RouteDecision("r1", schemas.Outcome.ROUTED, "w1", reason=schemas.REOFFERED))
    assert m.placing == {}  # nothing placed again


def test_an_ask_for_a_request_migration_moved_is_answered_with_where_it_runs_now():
    m: ReaskMemory[str] = ReaskMemory()
    m.ask(K, "a")
    m.settle(K, routed("w1"))
    assert m.ask(K, "b", moved_to="w2").decision.worker_id == "w2"
    assert m.ask(K, "c", moved_to="").decision.worker_id == "w1"  # followed, on no worker yet


def test_a_placement_that_found_no_worker_is_not_remembered_and_the_next_ask_places_again():
    m: ReaskMemory[str] = ReaskMemory()
    m.ask(K, "a")
    assert m.ask(K, "b") == Wait()
    no = schemas.RouteDecision("r1", schemas.Outcome.NO_CAPACITY, reason="all full")
    assert m.settle(K, no) == ["b"]
    assert m.ask(K, "c") == Place()


def test_a_failed_placement_hands_back_its_waiters_and_remembers_nothing():
    m: ReaskMemory[str] = ReaskMemory()
    m.ask(K, "a")
    m.ask(K, "b")
    assert m.settle(K, None) == ["b"]
    assert m.placed == {} and m.ask(K, "c") == Place()


def test_an_unanswered_offer_is_answered_unsure_and_the_next_ask_offers_that_worker_first_once():
    m: ReaskMemory[str] = ReaskMemory()
    m.ask(K, "a")
    d = m.unsure(K, "w3")
    assert (d.outcome, d.unsure, d.reason) == (schemas.Outcome.NO_CAPACITY, True, "no answer from w3")
    m.settle(K, d)
    assert m.ask(K, "b") == Place()  # unsure is not routed: placed again …
    assert m.first_offer(K) == "w3"  # … offered to w3 first
    assert m.first_offer(K) is None  # once


def test_a_decode_leg_and_a_reused_id_on_another_stream_are_other_requests():
    m: ReaskMemory[str] = ReaskMemory()
    ar = req("r1", reply_to="_INBOX.c.1")
    m.ask(key_of(ar), "a")
    m.settle(key_of(ar), routed("w1"))
    leg = key_of(req("r1", reply_to="_INBOX.c.1", kv_from="w1"))
    other = key_of(req("r1", reply_to="_INBOX.d.9"))
    assert m.ask(leg, "b") == Place()
    assert m.ask(other, "c") == Place()


def test_memory_is_bounded_oldest_forgotten_first():
    m: ReaskMemory[str] = ReaskMemory(capacity=2)
    for rid in ("a", "b", "c"):
        k = (rid, "x", "")
        m.ask(k, rid)
        m.settle(k, routed("w", rid))
        m.unsure(k, "w")
    assert list(m.placed) == [("b", "x", ""), ("c", "x", "")]
    assert list(m.unanswered) == [("b", "x", ""), ("c", "x", "")]
    with pytest.raises(ValueError):
        ReaskMemory(capacity=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ask", "route", "refuse", "fail"]), st.integers(0, 3)), max_size=60),
       st.integers(1, 3))
def test_a_request_is_placed_at_most_once_at_a_time_and_never_again_once_routed(ops, capacity):
    """A model: at any moment at most one placement per key runs; every waiter is handed back
    exactly once; a routed key (still remembered) is only ever answered, never placed."""
    m: ReaskMemory[int] = ReaskMemory(capacity=capacity)
    running: set[int] = set()
    waiting: dict[int, list[int]] = {}
    handed: list[int] = []
    issued = 0
    for op, k in ops:
        key = (f"r{k}", "inbox", "")
        if op == "ask":
            issued += 1
            got = m.ask(key, issued)
            if key in m.placed:
                assert isinstance(got, Answer) and got.decision.worker_id == f"w{k}"
            elif k in running:
                assert got == Wait()
                waiting.setdefault(k, []).append(issued)
            else:
                assert got == Place()
                running.add(k)
        elif k in running:
            decision = {"route": routed(f"w{k}", f"r{k}"), "fail": None,
                        "refuse": schemas.RouteDecision(f"r{k}", schemas.Outcome.NO_CAPACITY)}[op]
            back = m.settle(key, decision)
            assert back == waiting.pop(k, [])
            handed += back
            running.discard(k)
        assert len(m.placed) <= capacity and len(m.unanswered) <= capacity
        assert set(m.placing) == {(f"r{k}", "inbox", "") for k in running}
    assert len(handed) == len(set(handed))


async def test_the_shell_answers_a_joined_ask_from_the_one_placement_and_survives_a_cancelled_one():
    """RouterShell.place_once over the core, `place` replaced by a placement we release:
    three asks, one placement; the one cancelled while it waited is skipped."""
    import asyncio

    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.shell import RouterShell

    shell = RouterShell(RouterConfig(policy="least-loaded"))
    release, placements = asyncio.Event(), []

    async def place(ar, span=None, data=None, only=None, **_):
        placements.append(ar.request_id)
        await release.wait()
        return routed("w7", ar.request_id), 12

    shell.place = place
    ar = req("r1", reply_to="_INBOX.c.1")
    first = asyncio.create_task(shell.place_once(ar))
    second = asyncio.create_task(shell.place_once(ar))
    gone = asyncio.create_task(shell.place_once(ar))
    await until(lambda: placements and len(shell.reask.placing[key_of(ar)]) == 2)  # both joined the one
    gone.cancel()
    await until(gone.done)
    release.set()
    assert await first == (routed("w7"), 12)
    assert await second == (routed("w7"), None)
    assert gone.cancelled() and placements == ["r1"]
    again, _ = await shell.place_once(ar)
    assert (again.worker_id, again.reason) == ("w7", schemas.REOFFERED)


async def test_a_failed_placement_gives_its_joined_asks_its_error_and_a_cancelled_first_ask_stops_nothing():
    """The joined ask of a placement that raised gets that error (an in-process queue puts the
    request back on it), not a CancelledError it was never sent; and the first asker cancelled
    mid-offer leaves the placement running and remembered (a re-ask is answered from it)."""
    import asyncio

    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.shell import RouterShell

    shell = RouterShell(RouterConfig(policy="least-loaded"))
    release = asyncio.Event()

    async def broken(ar, span=None, data=None, only=None, **_):
        await release.wait()
        raise ConnectionError("closing")

    shell.place = broken
    ar = req("r2", reply_to="_INBOX.c.2")
    first = asyncio.create_task(shell.place_once(ar))
    joined = asyncio.create_task(shell.place_once(ar))
    await until(lambda: len(shell.reask.placing.get(key_of(ar), [])) == 1)
    release.set()
    for ask in (first, joined):
        try:
            await ask
            raise AssertionError("the failed placement answered")
        except ConnectionError as e:
            assert str(e) == "closing"
    assert key_of(ar) not in shell.reask.placed

    offered = asyncio.Event()
    release.clear()

    async def place(ar, span=None, data=None, only=None, **_):
        offered.set()
        await release.wait()
        return routed("w3", ar.request_id), 5

    shell.place = place
    ar = req("r3", reply_to="_INBOX.c.3")
    first = asyncio.create_task(shell.place_once(ar))
    await asyncio.wait_for(offered.wait(), 20)  # bounded: a missed step fails, not hangs
    first.cancel()
    await until(first.done)
    release.set()
    await until(lambda: key_of(ar) in shell.reask.placed)
    again, _ = await shell.place_once(ar)
    assert (again.worker_id, again.reason) == ("w3", schemas.REOFFERED)
