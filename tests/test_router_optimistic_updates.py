"""Between two heartbeats the router counts what it routed itself: a choice adds to its
worker's waiting requests and queued prefill until the worker's next heartbeat replaces the
guess; a refused choice adds nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_a_heartbeat_keeps_the_offers_still_unanswered():
    """The live race: a worker builds a heartbeat, the router routes r to it and offers it,
    then that heartbeat arrives. It predates r, so r's tokens stay on the row until the offer
    is answered; the heartbeat after the answer is the truth again."""
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1", running=1), 0.0)
    long = req("long", prompt_len=2500)
    choice = r.route(long, 0.0)
    assert choice.worker_id == "w0"
    r.offer_out("w0", long, choice)
    r.on_heartbeat(hb("w0", running=0, waiting=0, queued=0), 0.05)  # built before w0 took it
    assert (int(r.view.waiting[0]), float(r.view.queued_prefill[0]), int(r.view.kv_used[0])) == (1, 2500.0, 157)
    assert r.route(req("next", prompt_len=100), 0.06).worker_id == "w1"  # not w0 again
    r.offer_answered("w0", "long")
    assert r.unanswered == {}
    r.on_heartbeat(hb("w0", running=1, queued=2400), 0.1)  # taken: the worker's own count
    assert (int(r.view.waiting[0]), float(r.view.queued_prefill[0])) == (0, 2400.0)


def test_an_unanswered_offer_counts_only_its_uncached_tokens_once_per_heartbeat():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    a, b = req("a", prompt_len=40), req("b", prompt_len=1)
    for q in (a, b):
        r.offer_out("w0", q, r.route(q, 0.0))
    for t in (0.1, 0.2):  # each heartbeat is the base again, the two offers on top, not piled up
        r.on_heartbeat(hb("w0", queued=10), t)
        assert (int(r.view.waiting[0]), float(r.view.queued_prefill[0]), int(r.view.kv_used[0])) == (2, 51.0, 4)
    r.offer_answered("w0", "a")
    r.offer_answered("w0", "a")  # twice (a re-ask): nothing more to take off
    r.offer_answered("w9", "x")  # a worker never offered to
    r.on_heartbeat(hb("w0", queued=10), 0.3)
    assert (int(r.view.waiting[0]), float(r.view.queued_prefill[0])) == (1, 11.0)
    assert r.view.decisions == 2  # adding back is no decision (the tiebreak's recency is unchanged)


@settings(max_examples=100, deadline=None)  # a loaded machine: no per-example time limit
@given(st.lists(st.tuples(st.sampled_from(["offer", "answer", "heartbeat"]), st.integers(0, 5),
                          st.integers(1, 3000), st.integers(0, 4000)), max_size=40))
def test_after_any_heartbeat_the_row_is_it_plus_the_offers_out(steps):
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    out: dict[str, int] = {}  # request id → its prompt tokens (nothing cached: N = prompt)
    for t, (op, k, prompt, queued) in enumerate(steps, 1):
        rid = f"r{k}"
        if op == "offer" and rid not in out:
            q = req(rid, prompt_len=prompt)
            r.offer_out("w0", q, r.route(q, t))
            out[rid] = prompt
        elif op == "answer":
            r.offer_answered("w0", rid)
            out.pop(rid, None)
        elif op == "heartbeat":
            r.on_heartbeat(hb("w0", waiting=1, queued=queued), t)
            assert int(r.view.waiting[0]) == 1 + len(out)
            assert float(r.view.queued_prefill[0]) == queued + sum(out.values())
    assert {k for w in r.unanswered.values() for k in w} == set(out)
