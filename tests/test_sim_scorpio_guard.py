"""SCORPIO's two guards in the simulated engine, as the seed states them: the TPOT guard holds
every decode's SLO step by step (the token budget priced on the batch the step really runs),
and the TTFT guard (ttft_guard.py) rejects a waiting request as soon as its first token can no
longer come by its deadline — for vLLM's FCFS with the same rejection too — and errs on keeping:
no request it rejects would have made its deadline kept."""

from __future__ import annotations

import copy
import dataclasses

import msgspec
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.scheduler import VllmPolicy
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.services.worker.sim.ttft_guard import PrefillClock, full_step, unattainable, uncached
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import request_deadline_s

from bench.scorpio_goodput import LOOSE_MS, TIGHT_MS, simulate, workload
from bench.scorpio_tpot_scan import long_prompts, tpot_overshoot_ms
from tests.builders import req

PROF = profile("a100-llama3-8b")


def areq(rid: str, prompt: int, deadline: float, stp: float = 0.0, out: int = 8) -> AdmittedRequest:
    return req(rid, prompt, out, reply_to="", deadline_s=deadline, tpot_slo_ms=stp)


def fcfs_with_rejection() -> VllmPolicy:
    pol = VllmPolicy()
    pol.rejects_past_deadline = True
    return pol


def test_the_guard_predicts_from_the_work_ahead_and_does_not_count_whom_it_rejects():
    core = SimEngineCore(PROF, 16, policy=fcfs_with_rejection())
    n, tau = full_step(core, [])  # nothing running: a full 2,048-token step
    assert (n, tau) == (2048, pytest.approx(PROF.step_ms(2048, 0, 0, PROF.chunk_attn_ms(2048, 0)) / 1000))
    rate = n / tau
    one = 2000 / rate  # seconds to prefill one 2,000-token prompt
    core.add(areq("a", 2000, deadline=10.0))           # first token at 1·one
    core.add(areq("b", 2000, deadline=1.5 * one))       # at 2·one: too late
    core.add(areq("c", 2000, deadline=2.01 * one))      # at 2·one once b is gone: in time
    core.add(areq("d", 2000, deadline=2.99 * one))      # at 3·one: too late
    assert [s.rid for s in unattainable(core, 0.0)] == ["b", "d"]
    assert core.expire(0.0) == ["b", "d"] and sorted(core.seqs) == ["a", "c"]
    outs = core.step().outputs
    assert {(o.request_id, o.finish_reason) for o in outs if o.finish_reason == "deadline"} == {("b", "deadline"), ("d", "deadline")}


def test_a_policy_without_the_path_keeps_everyone_and_the_guard_waits_out_decodes_that_leave_no_room():
    core = SimEngineCore(PROF, 16)
    core.add(areq("a", 2000, deadline=0.001))
    assert core.expire(5.0) == []
    # SCORPIO beside a 10 ms decode: a decode alone takes longer, so no prompt token fits a step
    # while it runs; a waiting request is served once it has left
    for out, kept in ((500, False), (40, True)):
        pol = ScorpioPolicy(PROF)
        core = SimEngineCore(PROF, 16, policy=pol)
        core.add(areq("tight", 64, deadline=99.0, stp=10.0, out=out))
        core.step()
        core.add(areq("w", 64, deadline=2.0, stp=10.0))
        core.step()
        decodes = [s for s in core.running if s.computed >= s.target]
        assert pol.prefill_step(core, decodes)[0] == 0
        leaves = PrefillClock(core).seconds(1)  # out − 2 decode steps, then an empty engine's
        assert (leaves < 2.0) is kept
        assert core.expire(0.0) == ([] if kept else ["w"])


def run_forward(core: SimEngineCore, rid: str, now: float) -> float:
    """When `rid` gets its first token if the engine runs on from here, rejecting no one and
    taking no new request."""
    core.policy.rejects_past_deadline = False
    while rid in core.seqs:
        res = core.step()
        now += res.duration_s
        if any(o.request_id == rid and o.new_token_ids for o in res.outputs):
            return now
        assert res.duration_s > 0 or res.outputs
    raise AssertionError(f"{rid} finished without a token")


def false_rejections(policy: str, n: int, rate: float, seed: int, checked: int = 10) -> tuple[int, list[tuple[str, float]]]:
    """(rejections, those of the first `checked` that kept — the others rejected as the guard
    did — would have had their first token by their deadline, with the margin)."""
    reqs = workload(n, rate, seed=seed)
    core = SimEngineCore(PROF, 16, policy=ScorpioPolicy(PROF) if policy == "scorpio" else fcfs_with_rejection())
    now, k, total, false = 0.0, 0, 0, []
    while k < len(reqs) or core.has_work():
        while k < len(reqs) and reqs[k].arrival_s <= now:
            core.add(reqs[k])
            k += 1
        if not core.has_work():
            now = reqs[k].arrival_s
            continue
        late = unattainable(core, now) if core.waiting else []
        for seq in late:
            total += 1
            if total > checked:
                break
            kept = copy.deepcopy(core)
            for other in late:
                if other is not seq:
                    kept.abort(other.rid)
            first = run_forward(kept, seq.rid, now)
            if first <= request_deadline_s(seq.req):
                false.append((seq.rid, request_deadline_s(seq.req) - first))
        assert core.expire(now) == [s.rid for s in late]
        res = core.step()
        if res.duration_s <= 0 and not res.outputs:
            now = reqs[k].arrival_s if k < len(reqs) else now
            continue
        now += res.duration_s
    return total, false


@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.generate))
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["scorpio", "fcfs+reject"]))
def test_no_request_the_guard_rejects_would_have_made_its_deadline_kept(seed, policy):
    """It errs on keeping: each rejected request, kept on a copy of the engine (the others it
    rejected with it gone, nothing new arriving), gets its first token after its deadline
    (the first ten of each run checked: each is a run forward; 40 req/s is far past both policies'
    capacity, so the line builds up and the guard acts)."""
    total, false = false_rejections(policy, 300, 40.0, seed)
    assert total > 0  # the load rejects: the property is exercised
    assert false == []


def test_decodes_about_to_leave_do_not_make_a_waiting_request_look_late():
    """The case a one-step rate gets wrong: a 3,000-token prompt beside 8 decodes of a 16 ms SLO
    (120 prompt tokens fit beside them a step). Priced at that step for the whole prompt it
    looks late; they leave after 19 steps, then empty steps prefill the rest — the guard keeps
    it, and kept it makes its deadline."""
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    for i in range(8):
        core.add(areq(f"d{i}", 64, deadline=99.0, stp=16.0, out=20))
    core.step()
    decodes = [s for s in core.running if s.computed >= s.target]
    assert len(decodes) == 8
    core.add(areq("big", 3000, deadline=0.0, stp=16.0))
    first = run_forward(copy.deepcopy(core), "big", 0.0)
    n, tau = pol.prefill_step(core, decodes)
    at_todays_step = 3000 / n * tau
    assert n == 120 and first < at_todays_step  # the step beside all 8 decodes is too slow to be the price
    big = core.seqs["big"]
    for deadline, late in ((first, False), (0.5 * PrefillClock(core).seconds(3000), True)):
        big.req = msgspec.structs.replace(big.req, deadline_s=deadline)
        assert (unattainable(core, 0.0) == [big]) is late


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.sampled_from([8.0, 12.0, 16.0]))
@example(seed=1231, rate=12.0)  # a step of fewer tokens than its budget cost more (the profile's tiles)
@example(seed=213, rate=8.0)  # the first step where everyone runs forgot a loose decode's wait
def test_every_token_comes_within_its_requests_tpot_slo(seed, rate):
    """The TPOT guard, step by step: no decode waits longer than its SLO between two tokens
    (the tight ones run every step, each step fits their SLO; a loose one runs before its gap
    passes its own)."""
    assert tpot_overshoot_ms(PROF, workload(60, rate, seed=seed)) <= 1e-6


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.sampled_from([2.0, 4.0, 8.0]), cap=st.sampled_from([0, 1536]))
@example(seed=40, rate=2.0, cap=0)  # the 25 ms one still prefilling, a 50 ms decode skipped: 278 ms over
def test_every_token_comes_within_its_slo_beside_long_prompts(seed, rate, cap):
    """The same guarantee where the tightest request is often a long prompt still prefilling (the
    credit batch may then hold no decode), with and without vLLM's long_prefill_token_threshold
    (a chunk that stops short of the budget lets requests in behind it)."""
    prof = dataclasses.replace(PROF, long_prefill_token_threshold=cap)
    assert tpot_overshoot_ms(prof, long_prompts(40, rate, seed)) <= 1e-6


def test_whatever_a_step_schedules_under_its_budget_fits_the_tpot_slo():
    """The profile's linear ops are not monotone in the token count, and a step may schedule
    fewer tokens than its budget (a prompt's last chunk): priced as the step of exactly its
    budget, a 566-token budget let 540 tokens run 50.68 ms beside 22 decodes of a 50 ms SLO
    (seed 1231 at 12 req/s, 0.104 ms over). Priced as the most any step under it costs, every
    token count up to the budget fits, and the prompt takes one step more."""
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    for i in range(22):
        core.add(areq(f"d{i}", 500, deadline=99.0, stp=50.0, out=500))
    while core.waiting or any(s.computed < s.target for s in core.running):
        core.step()
    core.add(areq("big", 2747, deadline=99.0, stp=50.0, out=4))
    big, steps = core.seqs["big"], []
    while big.generated == 0:
        budget, k = pol.token_budget(core), big.computed
        decodes = [s for s in core.running if s.computed >= s.target]
        d, ctx = len(decodes), sum(pol.context(s) for s in decodes)
        worst = max(PROF.step_ms(d + n, d, ctx, PROF.chunk_attn_ms(n, k) if n else 0.0) for n in range(budget - d + 1))
        res = core.step()
        assert d == 22 and worst <= 50.0 and res.duration_s * 1000 <= worst
        steps.append((budget, res.scheduled_tokens))
    assert steps == [(582, 582), (580, 580), (578, 578), (543, 543), (532, 532), (523, 64)]


def test_a_loose_decodes_wait_counts_in_the_first_step_where_everyone_runs():
    """A 200 ms decode skips steps beside a 50 ms one (credit batching); when the tight one
    leaves, every running request has the same SLO and everyone runs (`folds`) — but the loose
    one has already waited two ~50 ms steps: that step's budget is what is left of its SLO
    (seed 213 at 8 req/s priced it at the whole 200 ms: a 151 ms step after 148 ms, 99.4 ms over)."""
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("t", 64, deadline=99.0, stp=50.0, out=4))
    core.add(areq("l", 64, deadline=99.0, stp=200.0, out=100))
    core.add(areq("big", 6000, deadline=99.0, stp=200.0, out=4))
    now, last, gaps, steps = 0.0, None, [], []
    while "l" in core.seqs:
        budget, folds = pol.token_budget(core), pol.folds(core.running)
        res = core.step()
        now += res.duration_s
        if any(o.request_id == "l" for o in res.outputs):
            gaps += [] if last is None else [(now - last) * 1000]
            last = now
        steps.append((budget, folds, round(res.duration_s * 1000, 2)))
    assert steps[1:6] == [(545, False, 49.59), (532, False, 49.78), (522, False, 49.67), (1045, True, 100.34), (2048, True, 141.88)]
    assert gaps[:2] == [pytest.approx(49.59, abs=0.01), pytest.approx(49.78 + 49.67 + 100.34, abs=0.01)]
    assert max(gaps) <= 200.0


def test_a_decode_the_credit_batch_skips_bounds_the_step_while_the_tightest_still_prefills():
    """A 200 ms decode skips steps beside a 50 ms one (credit batching); when that one leaves,
    the tightest running request is a 16,000-token prompt of a 50 ms SLO still prefilling, and
    the credit batch holds no decode. The step took the full 2,048 tokens (186 ms) after the
    loose one had waited two ~50 ms steps: 297 ms between two tokens, then, stuck, a 1-token
    step for it and a full one without it, 217-295 ms each. A skipped decode now bounds the step
    too: what is left of its SLO less the next step's decodes (85 ms here, after its 99 ms of
    waiting), and once run it leaves each long step ~13 ms of room."""
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("t", 64, deadline=99.0, stp=50.0, out=4))
    core.add(areq("l", 64, deadline=99.0, stp=200.0, out=100))
    core.add(areq("big", 16000, deadline=99.0, stp=50.0, out=4))
    big, now, last, gaps, steps = core.seqs["big"], 0.0, None, [], []
    while big.generated == 0:
        budget = pol.token_budget(core)
        res = core.step()
        now += res.duration_s
        ran = any(o.request_id == "l" for o in res.outputs)
        if ran:
            gaps += [] if last is None else [(now - last) * 1000]
            last = now
        steps.append((budget, round(res.duration_s * 1000, 2), ran))
    assert max(gaps) <= 200.0 and len(gaps) == 9 and min(gaps[1:]) > 199.0
    assert steps[1:8] == [(545, 49.59, True), (532, 49.78, False), (522, 49.67, False), (925, 85.12, False),
                          (67, 15.16, True), (1935, 186.8, False), (20, 12.93, True)]
    assert now == pytest.approx(1.8668, abs=1e-4)  # its first token (1.815 s when the loose one waited 297 ms)


def test_a_decode_behind_a_prefilling_prompt_keeps_its_token():
    """With vLLM's long_prefill_token_threshold set (1,900 here), a long prompt's chunk stops
    short of the budget and a 200 ms request is admitted behind it, then decodes while the
    prompt still prefills. The budget counts a token for it, but the core fills the budget in
    the batch's order: the chunk ahead took that token too, and the decode waited 1,062 ms.
    SCORPIO's batch puts its decodes first."""
    prof = dataclasses.replace(PROF, long_prefill_token_threshold=1900)
    pol = ScorpioPolicy(prof)
    core = SimEngineCore(prof, 16, policy=pol)
    core.add(areq("big", 16000, deadline=99.0, stp=50.0, out=4))
    core.step()
    core.add(areq("l", 64, deadline=99.0, stp=200.0, out=100))
    big, now, last, gaps = core.seqs["big"], 0.0, None, []
    while big.generated == 0:
        res = core.step()
        now += res.duration_s
        if any(o.request_id == "l" for o in res.outputs):
            gaps += [] if last is None else [(now - last) * 1000]
            last = now
        assert [s.rid for s in core.running] == ["big", "l"]  # the prompt ahead in the running order
    assert max(gaps) <= 200.0 and len(gaps) == 8


def test_the_guards_step_is_the_most_prompt_tokens_that_fit():
    """prefill_step bisected on the step time, which is not monotone in its tokens: beside one
    decode (context 500) of a 29.2 ms SLO it stopped at 263 prompt tokens (29.161 ms) where 351
    fit (29.122 ms), so the guard priced the prefill 25 % slower than the engine's step can
    run it — the wrong way for a guard that errs on keeping. It bisects on the step's monotone
    floor (LatencyProfile.step_ms_at_least) and walks down to the count that fits."""
    pol = ScorpioPolicy(PROF)
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("d", 499, deadline=99.0, stp=29.2, out=50))
    core.step()
    decodes = [s for s in core.running if s.computed >= s.target]
    assert [pol.context(s) for s in decodes] == [500]
    step = lambda n: PROF.step_ms(1 + n, 1, 500, PROF.chunk_attn_ms(n, 0) if n else 0.0)  # noqa: E731
    fitting = [n for n in range(2048) if step(n) <= 29.2]
    assert fitting[-1] == 351 and 263 in fitting and 264 not in fitting  # not an interval
    assert pol.prefill_step(core, decodes) == (351, pytest.approx(step(351) / 1000))
    assert step(263) == pytest.approx(29.161, abs=1e-3) and step(351) == pytest.approx(29.122, abs=1e-3)


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
        decodes = [s for s in core.running if s.computed >= s.target]
        n_best, tau = pol.prefill_step(core, decodes)  # the guard's step: its time counts the overhead too
        assert tau == pytest.approx((PROF.step_ms(8 + n_best, 8, ctx, PROF.chunk_attn_ms(n_best, 0)) + over_s * 1000) / 1000)
        assert PROF.step_ms(8 + n_best, 8, ctx, PROF.chunk_attn_ms(n_best, 0)) + over_s * 1000 <= 30.0
        budgets[over_s] = budget
    assert budgets[0.010] < budgets[0.0]


def host_tier_engine(policy) -> tuple[SimEngineCore, list[int]]:
    """An engine whose host tier holds a 1,024-token prefix the GPU evicted: A ran and was cached,
    B (2,064 tokens) took the GPU's room, and A's blocks went down to the host tier."""
    core = SimEngineCore(PROF, 16, num_blocks=130, host_blocks=200, policy=policy)
    a = list(range(1, 1025))
    for rid, tokens in (("A", a), ("B", list(range(5001, 7065)))):
        core.add(req(rid, tokens=tokens, max_tokens=2, tpot_slo_ms=200.0, deadline_s=99.0))
        while rid in core.seqs:
            core.step()
    assert core.pool.match_prefix(req("x", tokens=a).block_hashes) == 0 and len(core.host.lru) >= 64
    return core, a


@pytest.mark.parametrize("policy", ["scorpio", "fcfs+reject"])
def test_a_host_tier_prefix_is_priced_as_its_copy_not_as_prefill(policy):
    """A prefix hit in the host tier is not prefilled: admission copies it back at the host
    link's rate (admit.py). The guard prices that copy — not the prefill of those tokens, which
    would reject a request that makes its deadline, and not nothing."""
    core, a = host_tier_engine(ScorpioPolicy(PROF) if policy == "scorpio" else fcfs_with_rejection())
    core.add(req("C", tokens=[*a, *range(9001, 9101)], max_tokens=4, tpot_slo_ms=50.0, deadline_s=99.0))
    c = core.seqs["C"]
    assert uncached(core, c) == (100, 1024)  # 64 blocks in the host tier, 100 tokens to prefill
    clock = PrefillClock(core)
    copy_s = PROF.transfer_s(1024)
    kept_by = clock.seconds(100) + copy_s
    assert clock.seconds(1124) > kept_by  # priced as prefill it would look later
    for deadline, late in ((kept_by + 1e-6, False), (kept_by - 1e-6, True)):
        c.req = msgspec.structs.replace(c.req, deadline_s=deadline)
        assert (unattainable(core, 0.0) == [c]) is late
    assert run_forward(copy.deepcopy(core), "C", 0.0) >= kept_by  # so the one it rejected would have missed


def test_a_host_tier_copy_stays_inside_the_tightest_tpot():
    """The copy lengthens the step that admits the request (its transfer time is part of the
    step): SCORPIO's budget takes the window's copies off its bound, so the step still ends
    within the tight decodes' SLO."""
    core, a = host_tier_engine(ScorpioPolicy(PROF))
    for i in range(6):
        core.add(req(f"d{i}", prompt_len=64, max_tokens=200, tpot_slo_ms=40.0, deadline_s=99.0))
    core.step()
    assert sum(s.computed >= s.target for s in core.running) == 6
    core.add(req("C", tokens=[*a, *range(9001, 9601)], max_tokens=4, tpot_slo_ms=40.0, deadline_s=99.0))
    res = core.step()
    assert core.step_transfer_s == pytest.approx(PROF.transfer_s(1024))  # C came in, its prefix copied
    assert res.duration_s * 1000 <= 40.0
