"""One staleness rule (shared/staleness.py): admission, the queue and the router each count a
worker out after 10 of the heartbeat intervals it announces (1 s at the default 0.1 s), no
longer the queue and the router on a fixed 1 s while admission derived its bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.liveness import Liveness
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.shared import staleness

from tests.builders import hb, req


def judged(interval_s: float, silence_s: float) -> tuple[bool, bool, bool]:
    """(admission, queue, router): is a worker announcing `interval_s`, heard from at 100 s,
    still up at 100 s + silence_s?"""
    live = Liveness()
    live.beat("w0", interval_s, 100.0)
    q = QueueCore(QueueConfig(flow_control=False), FCFS())
    q.on_heartbeat(hb("w0", interval_s=interval_s), 100.0)
    r = RouterCore(RouterConfig(policy="least-loaded"))
    r.on_heartbeat(hb("w0", interval_s=interval_s), 100.0)
    now = 100.0 + silence_s
    routed = r.route(req("x"), now).worker_id == "w0"
    return live.fresh("w0", now), q.headroom(now) > 0, routed


@pytest.mark.parametrize(("interval_s", "bound_s"), [(0.0, 1.0), (0.1, 1.0), (0.05, 0.5), (0.5, 5.0)])
def test_admission_the_queue_and_the_router_count_a_silent_worker_out_at_the_same_moment(interval_s, bound_s):
    assert staleness.stale_after_s(interval_s) == pytest.approx(bound_s)
    assert judged(interval_s, bound_s * 0.98) == (True, True, True)
    assert judged(interval_s, bound_s * 1.02) == (False, False, False)


def test_a_fleet_that_beats_every_half_second_is_not_called_gone_after_one_second():
    """The fixed 1 s took a worker beating every 0.5 s out of the queue's and the router's
    candidates after two missed beats, while admission still counted it up."""
    assert judged(0.5, 1.5) == (True, True, True)


def test_the_override_is_one_bound_for_every_worker(monkeypatch):
    monkeypatch.setattr(staleness, "STALE_OVERRIDE_S", 3.0)
    assert staleness.stale_after_s(0.1) == staleness.stale_after_s(0.5) == 3.0
    assert judged(0.1, 2.9) == (True, True, True)
    assert judged(0.5, 3.1) == (False, False, False)


@given(beats=st.lists(st.tuples(st.sampled_from([0.0, 0.05, 0.1, 0.5]), st.floats(0, 10)), min_size=1, max_size=8),
       now=st.floats(0, 20))
@settings(max_examples=80, deadline=None)
def test_the_fast_paths_agree_with_judging_each_worker_on_its_own_bound(beats, now):
    """The queue's room sum and the router's `all_fresh` skip the pass over the fleet while its
    oldest heartbeat is within the least bound: with workers of different intervals they give
    what each worker judged alone gives."""
    q = QueueCore(QueueConfig(flow_control=False, slots_per_worker=1), FCFS())
    r = RouterCore(RouterConfig(policy="least-loaded"))
    seen = {}
    for i, (interval, t) in enumerate(beats):
        q.on_heartbeat(hb(f"w{i}", interval_s=interval), t)
        r.on_heartbeat(hb(f"w{i}", interval_s=interval), t)
        seen[f"w{i}"] = (t, staleness.stale_after_s(interval))
    now = max(now, max(t for t, _ in seen.values()))
    up = [w for w, (t, bound) in seen.items() if now - t <= bound]
    assert q.headroom(now) == len(up)
    assert r.view.all_fresh(now) == (len(up) == len(seen))
    assert [r.view.ids[i] for i in r.view.fresh(now).nonzero()[0]] == up
