"""SCORPIO's two guards in the simulated engine, as the seed states them: the TPOT guard holds
every decode's SLO step by step (the token budget priced on the batch the step really runs),
and the TTFT guard (ttft_guard.py) rejects a waiting request as soon as its first token can no
longer come by its deadline — for vLLM's FCFS with the same rejection too."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.replay import replay
from tokenyard.services.worker.sim.scheduler import VllmPolicy
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.services.worker.sim.ttft_guard import full_step_rate, unattainable
from tokenyard.shared.schemas import AdmittedRequest

from bench.scorpio_goodput import LOOSE_MS, TIGHT_MS, simulate, workload

PROF = profile("a100-llama3-8b")


def areq(rid: str, prompt: int, deadline: float, stp: float = 0.0, out: int = 8) -> AdmittedRequest:
    return AdmittedRequest(rid, "", "m", [], prompt, [], 16, out, 1, 0.0, deadline_s=deadline, tpot_slo_ms=stp)


def fcfs_with_rejection() -> VllmPolicy:
    pol = VllmPolicy()
    pol.rejects_past_deadline = True
    return pol


def test_the_guard_predicts_from_the_work_ahead_and_does_not_count_whom_it_rejects():
    core = SimEngineCore(PROF, 16, policy=fcfs_with_rejection())
    rate = full_step_rate(core)  # nothing running: a full 2,048-token step
    assert rate == pytest.approx(2048 / PROF.step_ms(2048, 0, 0, PROF.chunk_attn_ms(2048, 0)) * 1000)
    one = 2000 / rate  # seconds to prefill one 2,000-token prompt
    core.add(areq("a", 2000, deadline=10.0))           # first token at 1·one
    core.add(areq("b", 2000, deadline=1.5 * one))       # at 2·one: too late
    core.add(areq("c", 2000, deadline=2.01 * one))      # at 2·one once b is gone: in time
    core.add(areq("d", 2000, deadline=2.99 * one))      # at 3·one: too late
    assert [s.rid for s in unattainable(core, 0.0)] == ["b", "d"]
    assert core.expire(0.0) == ["b", "d"] and sorted(core.seqs) == ["a", "c"]
    outs = core.step().outputs
    assert {(o.request_id, o.finish_reason) for o in outs if o.finish_reason == "deadline"} == {("b", "deadline"), ("d", "deadline")}


def test_a_policy_without_the_path_keeps_everyone_and_an_engine_that_cannot_prefill_waits_for_the_deadline():
    core = SimEngineCore(PROF, 16)
    core.add(areq("a", 2000, deadline=0.001))
    assert core.expire(5.0) == []
    # SCORPIO with a 10 ms decode running: a decode alone takes longer, so no prompt token fits
    # a step (rate 0) and a waiting request goes only once its deadline has passed
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("tight", 64, deadline=99.0, stp=10.0, out=500))
    core.step()
    core.add(areq("w", 64, deadline=2.0, stp=10.0))
    core.step()
    assert pol.prefill_rate(core) == 0.0
    assert core.expire(1.9) == [] and core.expire(2.1) == ["w"]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.sampled_from([8.0, 12.0, 16.0]))
def test_every_token_comes_within_its_requests_tpot_slo(seed, rate):
    """The TPOT guard, step by step: no decode waits longer than its SLO between two tokens
    (the tight ones run every step, each step fits their SLO; a loose one runs before its gap
    passes its own)."""
    reqs = workload(60, rate, seed=seed)
    core = SimEngineCore(PROF, 16, policy=ScorpioPolicy(PROF))
    last: dict[str, float] = {}
    slo = {r.request_id: r.tpot_slo_ms for r in reqs}
    worst = 0.0
    for now, _, res in replay(core, reqs):
        for o in res.outputs:
            if not o.new_token_ids:
                continue
            if o.request_id in last:
                worst = max(worst, (now - last[o.request_id]) * 1000 - slo[o.request_id])
            last[o.request_id] = now
    assert worst <= 1e-6


def test_scorpio_beats_fcfs_with_the_same_rejection_where_fcfs_breaks_the_tight_slo():
    reqs = workload(300, rate=14.0, seed=1)
    fcfs, same, scorpio = (simulate(p, reqs) for p in ("fcfs", "fcfs+reject", "scorpio"))
    assert scorpio["tight_tpot_met"] == 1.0 and scorpio["loose_tpot_met"] == 1.0
    assert fcfs["tight_tpot_met"] < 0.5 and same["tight_tpot_met"] < 0.5
    assert scorpio["good"] > same["good"] >= fcfs["good"]
    assert {TIGHT_MS, LOOSE_MS} == {r.tpot_slo_ms for r in reqs}


def test_a_live_engines_step_overhead_comes_off_the_tpot_bound():
    """Live, a step costs more wall time than its model (the loop, the publishing): the budget
    leaves that time out of the SLO, and the guard's prefill rate counts it."""
    budgets = {}
    for over_s in (0.0, 0.010):
        pol = ScorpioPolicy(PROF)
        core = SimEngineCore(PROF, 16, policy=pol)
        for i in range(8):
            core.add(areq(f"d{i}", 32, deadline=99.0, stp=30.0, out=500))
        core.step()
        core.add(areq("big", 4000, deadline=99.0, stp=30.0))
        core.step_overhead_s = over_s
        budget = pol.token_budget(core)
        d, n = 8, budget - 8
        ctx = sum(s.req.prompt_len + s.generated for s in core.running)
        model_ms = PROF.step_ms(d + n, d, ctx, PROF.chunk_attn_ms(n, 0))
        assert model_ms + over_s * 1000 <= 30.0 < PROF.step_ms(d + n + 1, d, ctx, PROF.chunk_attn_ms(n + 1, 0)) + over_s * 1000
        assert pol.prefill_rate(core) == pytest.approx(n / (model_ms + over_s * 1000) * 1000)
        budgets[over_s] = budget
    assert budgets[0.010] < budgets[0.0]
