"""SCORPIO in the simulated engine (services/worker/sim/scorpio.py): TRP / VBS, credit-based
batching, VBS admission with deadline order, the token budget, heartbeat fields, and the
router's VBS filter."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tokenyard.services.router.filters import VbsFilter
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.core import Seq, SimEngineCore
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.scorpio import KeyedLine, ScorpioPolicy, estimated_tpot_ms, ldf_key
from tokenyard.services.worker.sim.ttft_guard import PrefillClock
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders

PROF = profile("a100-llama3-8b")


def areq(rid: str, stp: float = 0.0, prompt: int = 64, out: int = 32, arrival: float = 0.0, prio: int = 1,
         deadline: float = 0.0) -> AdmittedRequest:
    return builders.req(rid, prompt, out, prio, arrival_s=arrival, reply_to="", deadline_s=deadline, tpot_slo_ms=stp)


def decoding(rid: str, stp: float, order: int = 0) -> Seq:
    s = Seq(areq(rid, stp), order)
    s.computed = s.target  # prefilled: decoding
    return s


def test_vbs_of_the_seeds_example():
    pol = ScorpioPolicy(PROF)
    seqs = [decoding("r1", 2), decoding("r2", 4), decoding("r3", 6), decoding("w", 3)]
    vbs, tight = pol.vbs(seqs)
    assert tight == 2 and vbs == pytest.approx(1 + 0.5 + 1 / 3 + 2 / 3)


def test_credit_batching_runs_each_request_at_its_trp():
    pol = ScorpioPolicy(PROF)
    running = [decoding("a", 50, 0), decoding("b", 100, 1), decoding("c", 150, 2)]
    runs = {"a": 0, "b": 0, "c": 0}
    for _ in range(6):  # no step has happened yet: s = 0, the credits alone decide
        for s in pol.step_batch(running):
            runs[s.rid] += 1
    assert runs == {"a": 6, "b": 3, "c": 2}


def test_long_steps_make_loose_requests_run_before_their_slo_passes():
    pol = ScorpioPolicy(PROF)
    running = [decoding("a", 50, 0), decoding("c", 150, 1)]
    # steps take 60 ms (the engine's last, as each step's budget reads it): by its credits
    # alone c (TRP 1/3) would wait three steps, 180 ms, between tokens
    no_decode = SimpleNamespace(last_step_s=0.060, step_overhead_s=0.0, running=[])
    assert pol.token_budget(no_decode) == PROF.max_num_batched_tokens  # nothing decodes: the full budget
    steps = [(pol.gap(running[1]), [s.rid for s in pol.step_batch(running)]) for _ in range(4)]
    # c runs once gap + 2·60 > 150, gap the time since its last token: 0 at first (it joined
    # the engine in the step before, its token at that step's end: no), 60 (yes), then 0 after
    # it ran (no) and 60 (yes)
    assert steps == [(0.0, ["a"]), (60.0, ["a", "c"]), (0.0, ["a"]), (60.0, ["a", "c"])]


def test_equal_slos_fold_and_prefills_always_run():
    pol = ScorpioPolicy(PROF)
    same = [decoding("a", 80, 0), decoding("b", 80, 1)]
    assert pol.folds(same) and pol.step_batch(same) is same
    prefilling = Seq(areq("p", 500.0), 2)
    mixed = [decoding("a", 50, 0), prefilling, decoding("c", 1000, 1)]
    assert [s.rid for s in pol.step_batch(mixed)] == ["a", "p"]


def test_estimated_tpot_interpolates_between_batch_sizes():
    lo, hi = estimated_tpot_ms(PROF, 4, 500), estimated_tpot_ms(PROF, 5, 500)
    assert estimated_tpot_ms(PROF, 4.25, 500) == pytest.approx(lo + 0.25 * (hi - lo))
    assert estimated_tpot_ms(PROF, 0, 500) == 0.0


def test_ldf_line_serves_preempted_then_least_deadline():
    line = KeyedLine(ldf_key)
    a, b, c = (Seq(areq("a", arrival=1.0, prio=2), 0), Seq(areq("b", arrival=2.0, prio=0), 1),
               Seq(areq("c", arrival=0.0, deadline=1.5), 2))
    for s in (a, b, c):
        line.push(s)
    assert [s.rid for s in line.ordered()] == ["c", "b", "a"]  # deadlines 1.5, 2.5, 61
    d = Seq(areq("d", arrival=9.0), 3)
    line.push_front(d)
    line.remove(b)
    assert len(line) == 3 and [line.pop().rid for _ in range(3)] == ["d", "c", "a"]
    assert not line


def engine(stp_tight: float) -> tuple[SimEngineCore, ScorpioPolicy]:
    pol = ScorpioPolicy(PROF)
    return SimEngineCore(PROF, 16, policy=pol), pol


def test_vbs_admission_lets_a_loose_request_past_an_infeasible_tight_one():
    # tight SLO = the estimated TPOT of VBS 4.5 at context 96 (prompt 64 + up to 32 out)
    tight = estimated_tpot_ms(PROF, 4.5, 64)
    core, pol = engine(tight)
    for i in range(5):
        core.add(areq(f"t{i}", tight, arrival=float(i)))
    core.add(areq("loose", 10 * tight, arrival=9.0))
    core.step()  # the empty engine admits; then VBS 2, 3, 4 fit, 5 does not; loose (TRP 0.1) does
    assert sorted(s.rid for s in core.running) == ["loose", "t0", "t1", "t2", "t3"]
    assert [s.rid for s in core.waiting] == ["t4"]
    assert pol.refused >= 1
    stats = core.stats()
    assert stats.vbs == pytest.approx(4.1) and stats.min_tpot_slo_ms == tight
    assert 4.1 <= stats.vbs_limit < 5.0


def test_the_vbs_limit_is_the_largest_vbs_that_meets_the_slo():
    """The estimated TPOT is not monotone in VBS (the profile's linear ops: 41-45 tokens cost
    less than 40): at context 1,000 a 33.2 ms SLO is met up to VBS 175.75, missed from 175.8125
    to 176.9375 and met again up to 185.625. The bisection stopped at 175.75, so the router's
    filter (optimistic by design: the worker's admission has the last word) could drop a worker
    that would admit; the limit is the largest VBS that meets it."""
    est = [estimated_tpot_ms(PROF, i / 16, 1000) for i in range(16 * PROF.max_num_seqs + 1)]
    meets = [i / 16 for i, ms in enumerate(est) if ms <= 33.2]
    assert meets[-1] == 185.625 and 175.75 in meets and 175.8125 not in meets and 177.0 in meets
    assert ScorpioPolicy(PROF).vbs_limit(33.2, 1000) == 185.625
    for l_avg in (100, 500, 2000):  # and elsewhere: the largest, each SLO to 0.1 ms
        est = [estimated_tpot_ms(PROF, i / 16, l_avg) for i in range(16 * PROF.max_num_seqs + 1)]
        for tight in np.arange(12.0, 40.0, 0.1):
            largest = max((i for i, ms in enumerate(est) if ms <= tight), default=0)
            assert ScorpioPolicy(PROF).vbs_limit(float(tight), l_avg) == largest / 16


def test_token_budget_keeps_the_step_within_the_tightest_slo():
    core, pol = engine(0)
    for i in range(8):
        core.add(areq(f"d{i}", 30.0, prompt=32, out=500))
    core.step()
    core.step()  # all prefilled, decoding
    core.add(areq("big", 30.0, prompt=4000))
    budget = pol.token_budget(core)
    assert 8 < budget < PROF.max_num_batched_tokens
    b = 8
    ctx = int(sum(s.req.prompt_len + s.generated for s in core.running))
    n = budget - b
    assert PROF.step_ms(b + n, b, ctx, PROF.chunk_attn_ms(n, 0)) <= 30.0 < PROF.step_ms(
        b + n + 1, b, ctx, PROF.chunk_attn_ms(n + 1, 0))


def test_heartbeat_carries_vbs_fields_and_an_idle_engine_reports_none():
    core, _ = engine(0)
    assert (core.stats().vbs, core.stats().vbs_limit) == (0.0, 0.0)
    core.add(areq("a", 40.0))
    core.add(areq("b", 80.0))
    core.step()
    hb = WorkerCore(WorkerConfig("w0", "m"), ByteTokenizer()).heartbeat(core.stats(), 1.0)
    assert (hb.stats.vbs, hb.stats.min_tpot_slo_ms) == (1.5, 40.0) and hb.stats.vbs_limit > 1.5


def view_of(*rows: tuple[float, float, float]) -> FleetView:
    v = FleetView()
    for i, (vbs, m, limit) in enumerate(rows):
        v.upsert(builders.hb(f"w{i}", running=1, free=100, vbs=vbs, min_tpot_slo_ms=m, vbs_limit=limit), 0.0)
    return v


def test_vbs_filter_skips_workers_where_admission_would_fail():
    v = view_of((3.0, 50.0, 3.6), (3.0, 50.0, 4.0), (0.0, 0.0, 0.0), (2.0, 100.0, 6.0))
    f = VbsFilter()
    # s = 100: TRP 0.5 on rows 0-1 (VBS 3.5); row 3: 2 + 1 = 3 ≤ 6
    assert f.keep(areq("r", 100.0), v, 0.0).tolist() == [True, True, True, True]
    # s = 50: TRP 1 → 4.0: row 0's limit 3.6 fails
    assert f.keep(areq("r", 50.0), v, 0.0).tolist() == [False, True, True, True]
    # s = 25, tighter than everyone: VBS' = 3·0.5 + 1 = 2.5 vs limits 1.8, 2.0; row 3: 0.5 + 1 ≤ 1.5
    assert f.keep(areq("r", 25.0), v, 0.0).tolist() == [False, False, True, True]
    assert f.keep(areq("r", 0.0), v, 0.0) is True  # no SLO: no filtering
    assert isinstance(f.keep(areq("r", 50.0), v, 0.0), np.ndarray)


def test_scorpio_meets_more_tpot_slos_than_fcfs_under_mixed_slos():
    from bench.scorpio_goodput import simulate, workload

    reqs = workload(150, rate=16.0, seed=2)
    fcfs, scorpio = simulate("fcfs", reqs), simulate("scorpio", reqs)
    assert scorpio["tight_tpot_met"] > fcfs["tight_tpot_met"]
    assert scorpio["good"] > fcfs["good"]


def test_scorpio_rejects_a_request_it_kept_waiting_past_its_ttft_deadline():
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("tight", 10.0, arrival=0.0))  # 10 ms TPOT: alone it fits, nobody joins it
    core.step()
    core.add(areq("late", 10.0, arrival=0.0, deadline=2.0))
    core.add(areq("p1", 10.0, arrival=0.0))  # P1: arrival + 5 s
    core.step()
    assert {s.rid for s in core.waiting} == {"late", "p1"}  # the VBS check keeps them waiting
    # "tight" leaves after its 30 tokens to come (nothing fits beside it), then a 64-token prefill
    wait = PrefillClock(core).seconds(64)
    assert 30 * PROF.step_ms(1, 1, 64, 0.0) / 1000 < wait < 0.6
    assert core.expire(2.0 - wait - 1e-6) == []  # it could still make it
    assert core.expire(2.0 - wait + 1e-6) == ["late"] and "late" not in core.seqs  # once it cannot
    outs = core.step().outputs
    assert EngineOutput("late", [], True, "deadline", 0) in outs
    wait = PrefillClock(core).seconds(64)
    assert core.expire(5.0 - wait - 1e-6) == [] and core.expire(5.0 - wait + 1e-6) == ["p1"]
    assert [s.rid for s in core.waiting] == []
    assert core.expire(99.0) == []  # the running one is never rejected


def test_vllms_policy_and_scorpio_without_the_path_keep_late_requests():
    for pol in (None, ScorpioPolicy(PROF, reject=False)):
        core = SimEngineCore(PROF, 16, policy=pol)
        core.add(areq("a", 10.0, arrival=0.0))
        assert core.expire(100.0) == [] and "a" in core.seqs


def test_an_engine_that_guards_tpot_itself_reports_no_slack_for_flow_control_to_protect():
    """SCORPIO's budget keeps every step within its decodes' SLOs, so its engine reports no TPOT
    slack: the upstream decode term (the worker's `saturated` refusal, the queue's flow control,
    admission) holds prefill back only by the backlog, not by a slack the engine itself guards.
    vLLM's FCFS has no such guard: its slack still bounds what it is sent."""
    from tokenyard.services.worker.sim.kv_priority import PriorityKVPolicy
    from tokenyard.shared.slo import ENGINE_BACKLOG_S

    for pol, guards in ((None, False), (ScorpioPolicy(PROF), True), (PriorityKVPolicy(ScorpioPolicy(PROF)), True)):
        core = SimEngineCore(PROF, 16, policy=pol)
        core.add(areq("a", 50.0, out=4))  # near its end: little slack to come (shared.ecoserve.saved_slack_ms)
        core.step()
        core.step()
        stats = core.stats()
        assert (stats.tpot_slack_ms is None) is guards
        if not guards:
            assert 0 < stats.tpot_slack_ms < ENGINE_BACKLOG_S * 1000
        # a backlog of prefill longer than the decode's slack, shorter than the engine's backlog bound
        slack_s = 0.0 if guards else stats.tpot_slack_ms / 1000
        backlog_s = (slack_s + ENGINE_BACKLOG_S) / 2 if not guards else ENGINE_BACKLOG_S / 2
        queued = int(backlog_s * 1000 / stats.prefill_ms_per_token)
        assert WorkerCore.saturated(builders.stats(**{**{f: getattr(stats, f) for f in ("tpot_slack_ms", "prefill_ms_per_token")},
                                                      "queued": queued})) is not guards
