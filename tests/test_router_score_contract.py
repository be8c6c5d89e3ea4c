"""The pipeline's contract with scorers and guards: one finite score per candidate (else it
raises, naming the scorer), inputs declared up front (an unknown one is refused when the
pipeline is built), and notes returned on the choice rather than left on the objects."""

from __future__ import annotations

import numpy as np
import pytest
from tokenyard.services.router.filters import HealthyFilter
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import ArgminPicker, Narrowed, Pipeline, Scored

from tests.builders import hb, req
from tests.router_fakes import FixedScorer, pipeline


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
