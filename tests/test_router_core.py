"""The router's core: FleetView rows (upsert, optimistic update, swap-remove), the filters,
the pipeline's checks and tie-breaking, and the two baseline policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.core import POLICIES, RouterConfig, RouterCore
from tokenyard.services.router.filters import AcceptingFilter, HealthyFilter, ModelFilter
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import ArgminPicker, Narrowed, Pipeline, Scored
from tokenyard.services.router.policies.least_loaded import LeastLoadedScorer
from tokenyard.services.router.policies.round_robin import RoundRobinScorer
from tokenyard.shared.schemas import MacroState

from tests.builders import hb, req

MODEL = "m"


def row(view: FleetView, wid: str) -> dict:
    i = view.slot[wid]
    return {
        "id": view.ids[i],
        "macro": view.macro[i],
        "running": int(view.running[i]),
        "waiting": int(view.waiting[i]),
        "queued": float(view.queued_prefill[i]),
        "used": int(view.kv_used[i]),
        "free": int(view.kv_free[i]),
        "step_ms": float(view.step_ms[i]),
        "healthy": bool(view.healthy[i]),
        "accepting": bool(view.accepting[i]),
        "phase": int(view.phase[i]),
        "seen": float(view.seen_s[i]),
        "last_chosen": int(view.last_chosen[i]),
        "model": int(view.model[i]),
    }


class FixedScorer:
    """Scores given per worker id: a hand-written fake for pipeline tests."""

    name = "fixed"
    inputs = frozenset()

    def __init__(self, scores: dict[str, float]):
        self.scores = scores

    def score(self, req, view, cand):
        return Scored(np.array([self.scores[view.ids[i]] for i in cand]))


def pipeline(scorer, filters=None) -> Pipeline:
    return Pipeline("t", [HealthyFilter(1.0)] if filters is None else filters, scorer, ArgminPicker())


# ───────────────────────────── FleetView ─────────────────────────────


def test_upsert_adds_rows_in_arrival_order_with_every_field():
    v = FleetView()
    assert v.upsert(hb("w0", running=2, waiting=3, queued=40, used=7, free=93, step_time_ms=12.5, macro_id="m0", phase="prefill"), 5.0) == 0
    assert v.upsert(hb("w1", model="other", healthy=False), 6.0) == 1
    assert (v.n, v.ids, v.slot, v.model_codes) == (
        2,
        ["w0", "w1"],
        {"w0": 0, "w1": 1},
        {MODEL: 0, "other": 1},
    )
    assert row(v, "w0") == {
        "id": "w0",
        "macro": "m0",
        "running": 2,
        "waiting": 3,
        "queued": 40.0,
        "used": 7,
        "free": 93,
        "step_ms": 12.5,
        "healthy": True,
        "accepting": True,
        "phase": 1,
        "seen": 5.0,
        "last_chosen": -1,
        "model": 0,
    }
    assert (row(v, "w1")["healthy"], row(v, "w1")["model"], row(v, "w1")["phase"]) == (False, 1, 0)


def test_upsert_of_a_known_worker_overwrites_its_row():
    v = FleetView()
    v.upsert(hb("w0", running=1, waiting=1), 0.0)
    v.upsert(hb("w1"), 0.0)
    assert v.upsert(hb("w0", running=4, waiting=0, queued=9, draining=True, phase="decode"), 2.0) == 0
    assert v.n == 2
    r = row(v, "w0")
    assert (r["running"], r["waiting"], r["queued"], r["healthy"], r["phase"], r["seen"]) == (
        4,
        0,
        9.0,
        False,
        2,
        2.0,
    )


def test_growth_past_capacity_keeps_every_row():
    v = FleetView(capacity=1)
    for k in range(9):
        v.upsert(hb(f"w{k}", running=k, waiting=10 * k), float(k))
    v.note_routed(v.slot["w3"], 5)
    assert len(v.running) >= 9
    for k in range(9):
        r = row(v, f"w{k}")
        assert (r["running"], r["waiting"], r["seen"]) == (k, 10 * k + (k == 3), float(k))
        assert r["last_chosen"] == (0 if k == 3 else -1)
        assert r["accepting"]


def test_a_view_created_empty_grows():
    v = FleetView(capacity=0)
    assert v.upsert(hb("w0", running=1), 0.0) == 0
    assert v.upsert(hb("w1", running=2), 0.0) == 1
    assert (row(v, "w0")["running"], row(v, "w1")["running"]) == (1, 2)


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


def test_fresh_is_within_stale_after():
    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.5)
    assert v.fresh(1.0, 1.0).tolist() == [True, True]
    assert v.fresh(1.2, 1.0).tolist() == [False, True]


def test_set_accepting_of_an_unknown_worker_is_ignored():
    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.set_accepting("w9", False)
    v.set_accepting("w0", False)
    assert v.accepting[: v.n].tolist() == [False]


def test_forget_silent_swap_removes_and_keeps_rows_consistent():
    v = FleetView()
    for k in range(5):
        v.upsert(hb(f"w{k}", running=k, macro_id=f"m{k}"), 0.0)
    v.note_routed(v.slot["w4"], 3)
    v.set_accepting("w3", False)
    for k in (0, 2, 4):  # w1 and w3 go silent
        v.upsert(hb(f"w{k}", running=k, waiting=0 if k != 4 else 1, macro_id=f"m{k}"), 10.0)
    assert v.forget_silent(70.0, 60.0) == ["w1", "w3"]
    assert v.n == 3
    assert sorted(v.ids) == ["w0", "w2", "w4"]
    assert {w: v.ids[i] for w, i in v.slot.items()} == {"w0": "w0", "w2": "w2", "w4": "w4"}
    for k in (0, 2, 4):
        r = row(v, f"w{k}")
        assert (r["running"], r["macro"], r["seen"]) == (k, f"m{k}", 10.0)
    assert row(v, "w4")["last_chosen"] == 0 and row(v, "w4")["waiting"] == 1
    assert row(v, "w0")["last_chosen"] == -1
    assert v.forget_silent(70.0, 60.0) == []


def test_forget_silent_of_the_last_rows_and_of_everyone():
    v = FleetView()
    for k in range(3):
        v.upsert(hb(f"w{k}"), float(k))
    assert v.forget_silent(61.5, 60.0) == ["w0", "w1"]
    assert (v.ids, v.slot) == (["w2"], {"w2": 0})
    assert v.forget_silent(100.0, 60.0) == ["w2"]
    assert (v.n, v.ids, v.slot, v.macro) == (0, [], {}, [])
    assert v.upsert(hb("w1", running=5), 100.0) == 0
    assert row(v, "w1")["running"] == 5 and row(v, "w1")["last_chosen"] == -1


fleet_ops = st.lists(
    st.one_of(
        st.tuples(st.just("hb"), st.integers(0, 7), st.integers(0, 9)),
        st.tuples(st.just("route"), st.integers(0, 7), st.integers(0, 9)),
        st.tuples(st.just("tick"), st.integers(1, 40), st.just(0)),
    ),
    max_size=50,
)


@settings(max_examples=50, deadline=None)
@given(ops=fleet_ops)
def test_fleet_rows_match_a_model_after_any_sequence(ops):
    """Every row holds its worker's last heartbeat plus what was routed since, whatever the
    inserts, growths and swap-removes in between."""
    v = FleetView(capacity=2)
    model: dict[str, dict] = {}
    now = 0.0
    for op, k, x in ops:
        wid = f"w{k}"
        if op == "hb":
            v.upsert(hb(wid, running=x, waiting=x + 1, queued=3 * x, macro_id=f"m{x}"), now)
            prev = model.get(wid, {"last_chosen": -1})
            model[wid] = {
                "running": x,
                "waiting": x + 1,
                "queued": 3.0 * x,
                "macro": f"m{x}",
                "seen": now,
                "last_chosen": prev["last_chosen"],
            }
        elif op == "route" and wid in model:
            v.note_routed(v.slot[wid], x)
            model[wid]["waiting"] += 1
            model[wid]["queued"] += x
            model[wid]["last_chosen"] = v.decisions - 1
        elif op == "tick":
            now += k
            gone = v.forget_silent(now, 60.0)
            assert sorted(gone) == sorted(w for w, m in model.items() if now - m["seen"] > 60.0)
            for w in gone:
                del model[w]
        assert v.n == len(model) == len(v.ids) == len(v.macro) == len(v.slot)
        assert sorted(v.ids) == sorted(model)
        for w, m in model.items():
            r = row(v, w)
            assert {f: r[f] for f in m} == m


# ───────────────────────────── filters ─────────────────────────────


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


# ───────────────────────────── pipeline ─────────────────────────────


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


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_score_raises(bad):
    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.0)
    with pytest.raises(ValueError, match="scorer 'fixed' must return one finite score per candidate"):
        pipeline(FixedScorer({"w0": 1.0, "w1": bad})).choose(req(), v, 0.0)


def test_a_score_array_of_the_wrong_shape_raises():
    class Short:
        name = "short"
        inputs = frozenset()

        def score(self, req, view, cand):
            return Scored(np.zeros(len(cand) - 1))

    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.0)
    with pytest.raises(ValueError, match="scorer 'short'"):
        pipeline(Short()).choose(req(), v, 0.0)


def test_ties_break_on_score_then_least_recently_chosen_then_worker_id():
    v = FleetView()
    for w in ("w3", "w1", "w2", "w0"):
        v.upsert(hb(w), 0.0)
    scores = {"w0": 5.0, "w1": 1.0, "w2": 1.0, "w3": 1.0}
    p = pipeline(FixedScorer(scores))
    # w1, w2, w3 tie on score and were never chosen: smallest id
    assert p.choose(req(), v, 0.0).worker_id == "w1"
    v.note_routed(v.slot["w1"], 0)
    v.note_routed(v.slot["w3"], 0)
    # w2 never chosen beats both
    assert p.choose(req(), v, 0.0).worker_id == "w2"
    v.note_routed(v.slot["w2"], 0)
    # all chosen: w1 longest ago
    assert p.choose(req(), v, 0.0).worker_id == "w1"
    # a strictly lower score wins whatever the history
    scores["w3"] = 0.5
    assert p.choose(req(), v, 0.0).worker_id == "w3"


def test_picker_alone():
    v = FleetView()
    for w in ("b", "a", "c"):
        v.upsert(hb(w), 0.0)
    cand = np.array([0, 1, 2])
    assert ArgminPicker().pick(v, cand, np.array([2.0, 2.0, 1.0])) == 2
    assert ArgminPicker().pick(v, cand, np.array([1.0, 1.0, 1.0])) == 1  # "a"
    assert ArgminPicker().pick(v, np.array([0, 2]), np.array([1.0, 1.0])) == 0  # "b" < "c"


# ───────────────────────────── policies and the core ─────────────────────────────


def router(policy: str, stale: float = 1.0) -> RouterCore:
    return RouterCore(RouterConfig(policy=policy, stale_after_s=stale, forget_after_s=60.0))


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


def test_stale_and_unhealthy_workers_are_never_chosen():
    r = router("least-loaded", stale=1.0)
    r.on_heartbeat(hb("stale"), 0.0)
    r.on_heartbeat(hb("draining", draining=True), 1.5)
    r.on_heartbeat(hb("busy", running=50), 1.5)
    assert {r.route(req(), 2.0).worker_id for _ in range(4)} == {"busy"}
    r.on_heartbeat(hb("busy", running=50, healthy=False), 2.0)
    c = r.route(req(), 2.0)
    assert (c.worker_id, c.reason) == (None, "no candidate passed filter 'healthy'")


def test_route_with_exclude_after_a_refusal():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1", running=1), 0.0)
    assert r.route(req(), 0.0, exclude=frozenset({"w0"})).worker_id == "w1"
    assert r.route(req(), 0.0, exclude=frozenset({"w0", "w1"})).reason == "every candidate refused"
    assert [int(x) for x in r.view.waiting[:2]] == [0, 1]  # a refused choice updated nothing


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


def test_housekeeping_forgets_silent_workers():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1"), 30.0)
    assert r.housekeeping(61.0) == ["w0"]
    assert r.view.ids == ["w1"]
    assert r.route(req(), 30.5).worker_id == "w1"


def test_a_scorer_declaring_an_unknown_input_is_refused_when_the_pipeline_is_built():
    class Wants(FixedScorer):
        inputs = frozenset({"gpu_temperature"})

    with pytest.raises(ValueError, match=r"declares unknown inputs \['gpu_temperature'\]"):
        pipeline(Wants({}))


def test_guard_and_scorer_notes_land_on_the_choice_not_on_the_objects():
    class Halves:
        name, inputs = "halves", frozenset()

        def narrow(self, req, view, cand):
            return Narrowed(np.arange(len(cand)) < 1, "kept-first")

    class Noted(FixedScorer):
        def score(self, req, view, cand):
            return Scored(super().score(req, view, cand).scores, note="fixed-note")

    v = FleetView()
    v.upsert(hb("w0"), 0.0)
    v.upsert(hb("w1"), 0.0)
    p = Pipeline("t", [HealthyFilter()], Noted({"w0": 2.0, "w1": 1.0}), ArgminPicker(), [Halves()])
    c = p.choose(req(), v, 0.0)
    assert (c.worker_id, c.notes, c.over_budget) == ("w0", ("kept-first", "fixed-note"), False)
    assert vars(Halves()) == {}  # nothing was left on the guard
