"""The facts the fleet view keeps between decisions so that the usual fleet's filters cost no
array operation (every row healthy, accepting, fresh; no EcoServe row; one model): whatever
the sequence of heartbeats, keepalives, macro states and forgetting, each answers what the
arrays say (hypothesis), and the filters keep exactly the rows they kept before."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.router.filters import AcceptingFilter, EcoServeGuard, HealthyFilter, ModelFilter
from tokenyard.services.router.fleet import FleetView

from tests.builders import MODEL, hb, req

WORKERS = ("w0", "w1", "w2", "w3")
STALE_S = 3.0

times = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("heartbeat"), st.sampled_from(WORKERS), times, st.booleans(), st.booleans(),
                  st.sampled_from([MODEL, MODEL, "other"])),
        st.tuples(st.just("keepalive"), st.sampled_from(WORKERS), times),
        st.tuples(st.just("accepting"), st.sampled_from(WORKERS), st.booleans()),
        st.tuples(st.just("eco"), st.sampled_from(WORKERS), st.booleans()),
        st.tuples(st.just("forget"), times, st.floats(min_value=0.0, max_value=10.0)),
        st.tuples(st.just("decide"), st.sampled_from(WORKERS)),
    ),
    max_size=40,
)


def check(view: FleetView, now: float) -> None:
    n = view.n
    assert view.all_healthy() == bool(view.healthy[:n].all())
    assert view.all_accepting() == bool(view.accepting[:n].all())
    assert view.all_fresh(now, STALE_S) == bool(view.fresh(now, STALE_S).all())
    assert view.has_eco == bool(view.eco[:n].any())
    for model in (MODEL, "other", "unknown"):
        r = req(model=model)
        for f, full in ((HealthyFilter(STALE_S), view.healthy[:n] & view.fresh(now, STALE_S)),
                        (AcceptingFilter(), view.accepting[:n]),
                        (ModelFilter(), view.model[:n] == view.model_codes.get(model, -1))):
            kept = f.keep(r, view, now)
            assert np.array_equal(np.broadcast_to(kept, (n,)), full), (f.name, kept, full)


@settings(max_examples=300, deadline=None)
@given(ops=ops, probes=st.lists(times, min_size=1, max_size=4))
def test_the_kept_facts_are_what_the_rows_say(ops, probes):
    view = FleetView(capacity=2)
    for op in ops:
        kind = op[0]
        if kind == "heartbeat":
            _, wid, t, healthy, draining, model = op
            view.upsert(hb(wid, model=model, healthy=healthy, draining=draining), t)
        elif kind == "keepalive":
            view.keepalive(op[1], op[2])
        elif kind == "accepting":
            view.set_accepting(op[1], op[2])
        elif kind == "eco":
            view.set_ecoserve(op[1], op[2], 500.0)
        elif kind == "forget":
            view.forget_silent(op[1], op[2])
        elif (i := view.slot.get(op[1])) is not None:
            view.note_routed(i, 10)  # a decision: keepalives of this row are refused until its heartbeat
        for now in probes:
            check(view, now)


def test_a_direct_write_to_the_columns_is_seen_after_rows_written():
    view = FleetView()
    for wid in WORKERS:
        view.upsert(hb(wid), 10.0)
    assert HealthyFilter(STALE_S).keep(req(), view, 11.0) is True
    view.seen_s[2] = 1.0  # a bench making a row stale behind the view's back
    view.rows_written()
    assert HealthyFilter(STALE_S).keep(req(), view, 11.0).tolist() == [True, True, False, True]
    assert EcoServeGuard().narrow(req(), view, np.arange(view.n)).keep is True  # no EcoServe row
    view.set_ecoserve("w1", True, 500.0)
    assert view.has_eco
