"""The live engine's step overhead (services/worker/sim/overhead.py): a robust estimate, so one
long pause cannot starve SCORPIO's TPOT budget, while a machine that stays slow is followed."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.overhead import WINDOW, StepOverhead
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy

from tests.builders import req

PROF = profile("a100-llama3-8b")


def test_one_long_pause_does_not_move_the_estimate():
    est = StepOverhead()
    for _ in range(WINDOW):
        est.add(0.002)
    assert est.add(0.5) == 0.002  # a 500 ms GC pause: one sample of 32
    for _ in range(WINDOW // 2 - 1):
        assert est.add(0.002) == 0.002


def test_a_machine_that_stays_slow_moves_it_within_half_a_window():
    est = StepOverhead()
    for _ in range(WINDOW):
        est.add(0.002)
    seen = [est.add(0.012) for _ in range(WINDOW // 2 + 1)]
    assert seen[WINDOW // 2 - 2] == 0.002 and seen[-1] == 0.012


def test_early_steps_count_as_no_overhead_and_the_window_must_hold_a_sample():
    est = StepOverhead(window=3)
    assert est.add(-0.004) == 0.0 and est.estimate == 0.0
    with pytest.raises(ValueError):
        StepOverhead(window=0)


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(st.floats(-1.0, 5.0, allow_nan=False), min_size=1, max_size=100),
       pauses=st.integers(0, WINDOW // 2 - 1), pause=st.floats(0.05, 60.0))
def test_the_estimate_lies_within_the_windows_samples_and_fewer_than_half_outliers_stay_out(samples, pauses, pause):
    est = StepOverhead()
    for x in samples:
        e = est.add(x)
    window = [max(0.0, y) for y in samples][-WINDOW:]
    assert min(window) <= e <= max(window)
    # a steady machine, then fewer than half a window of pauses of any length: still the steady value
    est = StepOverhead()
    for _ in range(WINDOW):
        est.add(0.003)
    for _ in range(pauses):
        e = est.add(pause)
    assert est.estimate == 0.003


async def test_the_live_loop_feeds_the_estimate_in_the_profiles_seconds():
    """A SCORPIO engine on the real clock: the core's overhead is the estimate of the loop's
    measured samples, and a blocked event loop (one 300 ms stall) stays one sample."""
    core = SimEngineCore(PROF, 16, policy=ScorpioPolicy(PROF))
    engine = SimEngine(core)
    await engine.start()
    try:
        stream = engine.generate(req("r", prompt_len=64, max_tokens=120, tpot_slo_ms=50.0, deadline_s=time.time() + 99))
        n, before, after = 0, None, None
        async for out in stream:
            n += len(out.new_token_ids)
            if before is None and n >= 60:
                before = core.step_overhead_s
                time.sleep(0.3)  # the whole process stalls (a GC pause): the loop cannot run
            elif before is not None and after is None:
                after = core.step_overhead_s  # the stall's step has been measured
        assert n == 120 and after is not None
        assert core.step_overhead_s == engine.overhead.estimate
        assert after - before < 0.01  # one sample of the window (an EWMA of weight 0.1 took +30 ms)
    finally:
        await engine.stop()
