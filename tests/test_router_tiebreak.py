"""Ties break deterministically: on score, then the least recently chosen worker, then the
worker id — through the pipeline and in the picker alone."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import ArgminPicker

from tests.builders import hb, req
from tests.router_fakes import FixedScorer, pipeline


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
