"""The router's fleet view: one row per worker holding its last heartbeat (upsert, overwrite,
growth past capacity), freshness, and forgetting silent workers by swap-remove — rows stay
consistent whatever the sequence (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.fleet import FleetView

from tests.builders import MODEL, hb, req
from tests.router_fakes import router


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


def test_housekeeping_forgets_silent_workers():
    r = router("least-loaded")
    r.on_heartbeat(hb("w0"), 0.0)
    r.on_heartbeat(hb("w1"), 30.0)
    assert r.housekeeping(61.0) == ["w0"]
    assert r.view.ids == ["w1"]
    assert r.route(req(), 30.5).worker_id == "w1"
