"""SimEngineCore (continuous batching, chunked prefill, prefix caching, preemption) and the
latency profiles, on tiny engines with exact expected steps."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.engine import EngineOutput, EngineStats
from tokenyard.services.worker.sim.core import FILLER, SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES, LatencyProfile
from tokenyard.services.worker.sim.slack import FREE_PREFILL_MS_PER_TOKEN
from tokenyard.shared import hashing
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored

from tests import builders

BS = 4
req = partial(builders.req, block_size=BS)


def prof(budget: int = 64, max_seqs: int = 8, base: str = "zero", cap: int = 0) -> LatencyProfile:
    """`cap`: long_prefill_token_threshold (0, the default: none; tests/test_sim_prefill_cap.py
    pins the cap, the properties below draw one)."""
    return dataclasses.replace(PROFILES[base], max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                               long_prefill_token_threshold=cap)


def engine(budget: int = 64, max_seqs: int = 8, blocks: int = 64, base: str = "zero",
           cap: int = 0) -> SimEngineCore:
    return SimEngineCore(prof(budget, max_seqs, base, cap), block_size=BS, num_blocks=blocks)


def token(rid: str, pos: int) -> int:
    return FILLER[(len(rid) + pos) % len(FILLER)]


def out(
    rid: str, pos: int | None, done: bool = False, cached: int = 0, reason: str | None = None
) -> EngineOutput:
    toks = [] if pos is None else [token(rid, pos)]
    return EngineOutput(rid, toks, done, reason or ("length" if done else None), cached)


def steps(core: SimEngineCore, limit: int = 1000) -> list[list[EngineOutput]]:
    """Step until idle; fails if the engine makes no end (a livelock)."""
    trace = []
    while core.has_work():
        trace.append(core.step().outputs)
        assert len(trace) < limit, "the engine never drained"
    return trace


def check_blocks(core: SimEngineCore) -> None:
    """Every block the pool has in use belongs to a request, and each running request holds
    exactly the blocks its computed tokens (plus this step's) need."""
    seqs = list(core.running) + list(core.waiting)
    assert core.pool.private == sum(s.private for s in seqs)
    held: dict[int, int] = {}
    for s in seqs:
        for h in s.cached:
            held[h] = held.get(h, 0) + 1
    assert {h: n for h, n in core.pool.ref.items() if n > 0} == held
    for s in core.running:
        if s.computed >= s.target:  # decoding: the KV of every token but the newest is in
            assert s.computed == s.req.prompt_len + s.generated - 1
        assert s.blocks == -(-s.computed // BS)


# ───────────────────────────── batching ─────────────────────────────


def test_two_requests_batch_continuously_one_token_per_step():
    core = engine()
    core.add(req("a", tokens=list(range(6)), max_tokens=3))
    core.add(req("bb", tokens=list(range(10, 15)), max_tokens=2))
    r = core.step()
    assert r.outputs == [out("a", 0), out("bb", 0)]  # both prefilled, both emit their first token
    assert r.scheduled_tokens == 11
    r = core.step()
    assert r.outputs == [out("a", 1), out("bb", 1, done=True)]
    assert r.scheduled_tokens == 2
    assert core.step().outputs == [out("a", 2, done=True)]
    assert not core.has_work()
    assert (core.pool.used, core.pool.available) == (0, 64)


def test_a_request_of_one_token_finishes_at_its_prefill():
    core = engine()
    core.add(req("a", tokens=[1, 2, 3], max_tokens=1))
    assert steps(core) == [[out("a", 0, done=True)]]


def test_chunked_prefill_under_the_token_budget():
    core = engine(budget=8)
    core.add(req("a", tokens=list(range(20)), max_tokens=2))
    core.add(req("b", tokens=list(range(100, 106)), max_tokens=1))
    r1, r2, r3 = core.step(), core.step(), core.step()
    assert [r1.scheduled_tokens, r2.scheduled_tokens, r3.scheduled_tokens] == [8, 8, 8]
    assert r1.outputs == [] and r2.outputs == []
    # step 3: a's last 4 prompt tokens, then b's first chunk of 4 in the budget left
    assert r3.outputs == [out("a", 0)]
    assert core.stats().queued_prefill_tokens == 2
    r4 = core.step()  # a decodes (1 token) first, then b's last 2 prompt tokens
    assert r4.scheduled_tokens == 3
    assert r4.outputs == [out("b", 0, done=True), out("a", 1, done=True)]
    assert not core.has_work()


def test_decodes_go_before_new_prefills_and_max_num_seqs_caps_the_batch():
    core = engine(budget=64, max_seqs=2)
    for rid in ("a", "b", "c"):
        core.add(req(rid, tokens=[1, 2, 3, ord(rid)], max_tokens=2))
    assert core.step().outputs == [out("a", 0), out("b", 0)]
    s = core.stats()
    assert (s.running, s.waiting, s.queued_prefill_tokens) == (2, 1, 4)
    assert core.step().outputs == [out("a", 1, done=True), out("b", 1, done=True)]
    assert core.step().outputs == [out("c", 0)]
    assert core.step().outputs == [out("c", 1, done=True)]


def test_stats_count_running_waiting_and_blocks():
    core = engine(budget=8, blocks=16)
    core.add(req("a", tokens=list(range(12)), max_tokens=4))
    core.add(req("b", tokens=list(range(50, 55)), max_tokens=4))
    free = FREE_PREFILL_MS_PER_TOKEN  # profile zero: a prefill that takes no time, measured
    # both P1 (the builder's class): a P0 would wait behind neither, a P1 behind both
    assert core.stats() == EngineStats(0, 2, 17, 0, 16, BS, prefill_ms_per_token=free, queued_prefill_ahead=[0, 17, 17, 17],
                                       queued_prefill_ahead_net=[0, 17, 17, 17])
    core.step()  # a: 8 of 12
    assert core.stats() == EngineStats(1, 1, 9, 2, 14, BS, prefix_queries=12, compute_util=1.0,
                                       prefill_ms_per_token=free, queued_prefill_ahead=[4, 9, 9, 9],
                                       queued_prefill_ahead_net=[4, 9, 9, 9])
    core.step()  # a: last 4 (first token); b: 4 of 5
    # a's slack: its 3 tokens after the first, 100 ms each, decode steps of 0 ms (profile zero)
    assert core.stats() == EngineStats(2, 0, 1, 4, 12, BS, prefix_queries=17, tpot_slack_ms=300.0, compute_util=1.0,
                                       prefill_ms_per_token=free, queued_prefill_ahead=[1, 1, 1, 1],
                                       queued_prefill_ahead_net=[1, 1, 1, 1])


def test_a_waiting_higher_class_gets_only_the_budget_a_running_prefill_leaves():
    """vLLM V1's scheduler with scheduling_policy="priority" (v1/core/sched/scheduler.py,
    `schedule`): the running requests are scheduled first, each its next chunk, and only then
    the waiting line by (priority, arrival) with the budget left. A waiting P0 does not preempt a
    running P2's chunked prefill (preemption happens only when a running request cannot get
    KV blocks) and does not take its budget: it gets what the P2's chunk leaves, then goes
    before every waiting request of a lower class."""
    core = engine(budget=8, blocks=64)
    core.add(req("p2", tokens=list(range(20)), max_tokens=2, priority=2))
    core.step()  # p2: 8 of 20
    core.add(req("q1", tokens=list(range(40, 46)), max_tokens=2, priority=1))
    core.add(req("z0", tokens=list(range(60, 66)), max_tokens=2, priority=0))
    assert core.stats().queued_prefill_ahead == [12 + 6, 12 + 12, 24, 24]
    r = core.step()  # p2's next chunk takes the whole budget: the P0 waits
    assert r.scheduled_tokens == 8 and r.outputs == [] and core.preemptions == 0
    assert [s.rid for s in core.running] == ["p2"]
    r = core.step()  # p2's last 4, then the P0's first 4 (not the P1's, which arrived first)
    assert r.outputs == [out("p2", 0)]
    assert [s.rid for s in core.running] == ["p2", "z0"] and core.seqs["z0"].computed == 4
    assert core.stats().queued_prefill_ahead == [2, 8, 8, 8]
    r = core.step()  # p2 decodes, the P0 finishes its prefill, the P1 gets the rest
    assert r.outputs == [out("z0", 0), out("p2", 1, done=True)]
    assert core.preemptions == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 3)), min_size=1, max_size=8), st.integers(0, 6))
def test_the_prefill_ahead_of_each_class_is_what_the_engines_order_puts_first(reqs, n_steps):
    """queued_prefill_ahead[c] = the running requests' prefill still to do + the waiting ones'
    of class ≤ c, recomputed from the engine's state; non-decreasing in c, the last the whole
    backlog."""
    core = engine(budget=16, blocks=256)
    for k, (plen, cls) in enumerate(reqs):
        core.add(req(f"r{k}", tokens=list(range(100 * k, 100 * k + plen)), max_tokens=3, priority=cls))
    for _ in range(n_steps):
        core.step()
    stats = core.stats()
    running = sum(s.target - s.computed for s in core.running if s.computed < s.target)
    want = [running + sum(s.target - s.computed for s in core.waiting if s.req.priority <= c) for c in range(4)]
    assert stats.queued_prefill_ahead == want
    assert stats.queued_prefill_ahead_net == want  # distinct prompts: nothing cached
    assert want == sorted(want) and want[-1] == stats.queued_prefill_tokens


def test_stats_report_a_decodes_step_cost_per_token_of_its_context():
    """What admission's sustainable drain reads: a decode of context K adds K × this to a step."""
    p = PROFILES["a100-llama3-8b"]
    stats = SimEngineCore(p, block_size=BS, num_blocks=16).stats()
    per_ctx = (p.step_s(1, 2000, []) - p.step_s(1, 0, [])) * 1000.0 / 2000
    assert stats.decode_ms_per_ctx_token == pytest.approx(per_ctx) and per_ctx > 0


# ───────────────────────────── prefix cache ─────────────────────────────


def test_a_second_request_with_the_same_prompt_hits_the_cache():
    core = engine()
    prompt = list(range(20))  # five full blocks
    core.add(req("a", tokens=prompt, max_tokens=2))
    steps(core)
    core.add(req("b", tokens=prompt, max_tokens=2))
    r = core.step()
    # all but the last block: at least one token is always computed
    assert r.outputs == [out("b", 0, cached=16)]
    assert r.scheduled_tokens == 4
    assert core.step().outputs == [out("b", 1, done=True, cached=16)]
    s = core.stats()
    assert (s.prefix_hits, s.prefix_queries) == (16, 40)


def test_a_shared_prefix_hits_its_whole_blocks_only():
    core = engine()
    core.add(req("a", tokens=list(range(18)), max_tokens=1))
    steps(core)
    core.add(req("b", tokens=list(range(10)) + [99] * 8, max_tokens=1))  # shares two full blocks and 2 tokens
    core.add(req("c", tokens=list(range(18)), max_tokens=1))  # 4 full blocks cached, 2 tokens more
    assert core.step().outputs == [out("b", 0, done=True, cached=8), out("c", 0, done=True, cached=16)]


def test_a_prefix_is_shared_by_running_requests():
    core = engine()
    prompt = list(range(16))
    core.add(req("a", tokens=prompt + [1, 2, 3, 4], max_tokens=3))
    core.step()
    core.add(req("b", tokens=prompt + [5, 6, 7, 8], max_tokens=3))
    core.step()
    b = core.seqs["b"]
    assert b.cached_tokens == 16
    assert b.cached[:4] == core.seqs["a"].cached[:4]
    assert all(core.pool.ref[h] == 2 for h in b.cached[:4])
    check_blocks(core)


def test_kv_events_describe_the_blocks_a_prefill_stores():
    core = engine(budget=8)
    prompt = list(range(10))
    core.add(req("a", tokens=prompt, max_tokens=1))
    core.step()
    chain = hashing.hash_chain(prompt, BS)
    assert core.pool.drain_events() == [BlockStored(chain, None, prompt[:8], BS, medium="GPU")]
    core.step()
    assert core.pool.drain_events() == []  # the partial third block is not cacheable


def test_eviction_follows_lru_and_is_announced():
    core = engine(blocks=4)
    a, b = list(range(8)), list(range(20, 28))
    core.add(req("a", tokens=a, max_tokens=1))
    steps(core)
    core.add(req("b", tokens=b, max_tokens=1))
    steps(core)
    core.pool.drain_events()
    core.add(req("c", tokens=list(range(40, 52)), max_tokens=1))  # three blocks: a's two go first, then b's tail
    steps(core)
    ca, cb = hashing.hash_chain(a, BS), hashing.hash_chain(b, BS)
    events = core.pool.drain_events()
    assert events[0] == BlockRemoved([ca[1], ca[0], cb[1]], medium="GPU")
    assert core.pool.match_prefix(cb) == 1


# ───────────────────────────── preemption and abort ─────────────────────────────


def test_the_newest_request_is_preempted_when_blocks_run_out_and_still_finishes():
    core = engine(blocks=4)
    core.add(req("a", tokens=list(range(7)), max_tokens=6))  # 2 blocks for its prompt; a third at token 9
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    assert core.step().outputs == [out("a", 0), out("b", 0)]
    assert core.step().outputs == [out("a", 1), out("b", 1)]  # tokens 8: still two blocks each
    # a needs its third block and takes b's: b (newest) is preempted and waits
    r = core.step()
    assert r.outputs == [out("a", 2)]
    assert core.preemptions == 1
    assert [s.rid for s in core.waiting] == ["b"]
    check_blocks(core)
    trace = steps(core)
    got = {}
    for outs in [[out("a", 0), out("b", 0)], [out("a", 1), out("b", 1)], r.outputs, *trace]:
        for o in outs:
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                assert o.finish_reason == "length"
    assert got == {"a": [token("a", k) for k in range(6)], "b": [token("b", k) for k in range(6)]}
    assert (core.pool.used, core.pool.available) == (0, 4)


def test_a_step_that_preempts_admits_no_waiting_request():
    """vLLM V1 (`schedule`: the waiting line is scheduled only `if not preempted_reqs`): a
    step whose running requests preempted one for blocks takes no new request, though budget
    and blocks for it are left."""
    core = engine(blocks=6)
    core.add(req("a", tokens=list(range(7)), max_tokens=6))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    core.step()
    core.step()  # a, b: 2 blocks each; 2 free
    core.add(req("c", tokens=[90], max_tokens=2, priority=0))  # one block; it waits, its line's head
    core.pool.allocate(1)  # one block held elsewhere: a's third block (token 9, this step) fits, b's does not
    r = core.step()
    assert core.preemptions == 1 and [s.rid for s in core.running] == ["a"]
    assert core.pool.available == 2 and r.scheduled_tokens == 1  # b's blocks back, budget left
    assert r.outputs == [out("a", 2)]  # and yet c waits for the next step
    assert [s.rid for s in core.waiting.ordered()] == ["c", "b"]
    assert core.step().outputs == [out("c", 0), out("a", 3)]  # the next step admits again


def test_the_last_running_request_preempts_itself_and_re_prefills_later():
    core = engine(blocks=5)
    core.add(req("a", tokens=list(range(8)), max_tokens=9))
    core.add(req("b", tokens=list(range(30, 38)), max_tokens=9))
    assert core.step().outputs == [out("a", 0), out("b", 0)]
    # token 9 of each needs a third block; a gets the last free one, b (last in line) has
    # nobody newer to preempt: it preempts itself and waits, its prompt blocks evictable
    assert core.step().outputs == [out("a", 1)]
    assert (core.preemptions, [s.rid for s in core.waiting]) == (1, ["b"])
    assert core.seqs["b"].target == 9  # prompt + the token it generated
    for k in range(2, 9):
        assert core.step().outputs == [out("a", k, done=k == 8)]
    # a's fourth block (token 13) evicted the tail of b's cached prompt; b's re-prefill finds
    # its first block and computes the other 5 tokens
    b_chain = hashing.hash_chain(list(range(30, 38)), BS)
    assert BlockRemoved([b_chain[1]], medium="GPU") in core.pool.drain_events()
    r = core.step()
    assert (r.outputs, r.scheduled_tokens) == ([out("b", 1)], 5)
    assert core.seqs["b"].computed == 9
    for k in range(2, 9):
        assert core.step().outputs == [out("b", k, done=k == 8)]
    assert not core.has_work()
    assert (core.preemptions, core.pool.used, core.pool.available) == (1, 0, 5)


def test_a_preempted_request_reports_its_first_prefix_hit():
    core = engine(blocks=4)
    core.add(req("a", tokens=list(range(7)), max_tokens=6))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    finals = {o.request_id: o for outs in steps(core) for o in outs if o.finished}
    assert core.preemptions >= 1
    # b's prompt was computed from scratch: what its re-prefill found cached does not count
    assert finals["b"].num_cached_tokens == 0


def test_computed_tokens_stay_exact_through_preemptions():
    core = engine(blocks=6, budget=16)
    for k in range(4):
        core.add(req(f"r{k}", tokens=list(range(10 * k, 10 * k + 6)), max_tokens=8))
    while core.has_work():
        core.step()
        check_blocks(core)


def test_no_livelock_when_a_waiting_prefix_hit_pins_blocks():
    # b's first block is cached; b waits for room while a, running, needs every block
    core = engine(blocks=6, budget=64)
    shared = [1, 2, 3, 4]
    core.add(req("warm", tokens=shared + [0], max_tokens=1))
    steps(core)
    core.add(req("a", tokens=list(range(100, 108)), max_tokens=12))  # 8 + 12 = 20 tokens: 5 blocks
    core.add(req("b", tokens=shared + list(range(200, 212)), max_tokens=4))  # 16 + 4: 5 blocks, 1 of them cached
    trace = steps(core, limit=200)
    done = [o.request_id for outs in trace for o in outs if o.finished]
    assert sorted(done) == ["a", "b"]


def test_abort_ends_a_request_at_the_next_step_and_frees_its_blocks():
    core = engine(budget=8)
    core.add(req("a", tokens=list(range(12)), max_tokens=5))
    core.add(req("b", tokens=list(range(40, 44)), max_tokens=5))
    core.step()
    assert core.abort("a") is True
    assert core.abort("b") is True  # still waiting
    assert core.abort("a") is False
    assert core.abort("zz") is False
    assert core.has_work()
    assert core.step().outputs == [
        EngineOutput("a", [], True, "abort", 0),
        EngineOutput("b", [], True, "abort", 0),
    ]
    assert not core.has_work()
    assert (core.pool.used, core.pool.available) == (0, 64)
    assert core.seqs == {}


def test_add_refuses_a_duplicate_and_a_request_larger_than_the_pool():
    core = engine(blocks=4)
    core.add(req("a", tokens=[1, 2, 3], max_tokens=2))
    with pytest.raises(ValueError, match="request a is already in the engine"):
        core.add(req("a", tokens=[1, 2, 3], max_tokens=2))
    with pytest.raises(ValueError, match="request needs 5 KV blocks; the engine has 4"):
        core.add(req("big", tokens=list(range(16)), max_tokens=2))
    core.add(req("fits", tokens=list(range(14)), max_tokens=2))


def test_step_duration_is_the_profiles_step_time_of_its_batch():
    p = prof(budget=16, base="a100-llama3-8b")
    core = SimEngineCore(p, block_size=BS, num_blocks=64)
    core.add(req("a", tokens=list(range(20)), max_tokens=3))
    core.add(req("b", tokens=list(range(40, 46)), max_tokens=3))
    r = core.step()  # a: chunk of 16 from 0
    assert r.duration_s == p.step_s(0, 0, [(16, 0)])
    r = core.step()  # a: last 4 from 16; b: 6 from 0 (+ their first tokens)
    assert r.duration_s == p.step_s(0, 0, [(4, 16), (6, 0)])
    r = core.step()  # both decode: contexts 20 + 1 and 6 + 1
    assert r.duration_s == p.step_s(2, 28, [])
    assert core.stats().step_time_ms == r.duration_s * 1000.0
    assert SimEngineCore(p, BS, 8).step().duration_s == 0.0  # idle


# ───────────────────────────── properties ─────────────────────────────

PREFIXES = [list(range(8)), list(range(50, 54)), []]
mixes = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),  # shared prefix
        st.integers(1, 9),  # own tokens after it
        st.integers(1, 6),  # max_tokens
        st.integers(0, 12),  # submitted at step
        st.one_of(st.none(), st.integers(0, 15)),  # aborted at step
    ),
    min_size=1,
    max_size=10,
)
engines = st.tuples(st.integers(4, 24), st.integers(1, 4), st.integers(6, 16),  # budget, max seqs, blocks
                    st.sampled_from([0, 1, 3, 8]))  # chunk cap (0: none)


def simulate(mix, budget, max_seqs, blocks, cap=0):
    core = engine(budget=budget, max_seqs=max_seqs, blocks=blocks, cap=cap)
    outputs: list[tuple[int, EngineOutput]] = []
    events = []
    reqs = {}
    for k, (pre, own, mt, at, ab) in enumerate(mix):
        toks = PREFIXES[pre] + [1000 + 10 * k + j for j in range(own)]
        reqs[f"r{k}"] = (req(f"r{k}", tokens=toks, max_tokens=mt), at, ab)
    step = 0
    while step <= 16 or core.has_work():
        for rid, (r, at, ab) in reqs.items():
            if at == step:
                core.add(r)
            if ab == step and ab >= at:
                core.abort(rid)
        outputs += [(step, o) for o in core.step().outputs]
        events += core.pool.drain_events()
        check_blocks(core)
        step += 1
        assert step < 500, "the engine never drained"
    return core, reqs, outputs, events


@settings(max_examples=50, deadline=None)
@given(mix=mixes, eng=engines)
def test_every_request_ends_exactly_once(mix, eng):
    core, reqs, outputs, events = simulate(mix, *eng)
    ends: dict[str, list[str]] = {}
    tokens: dict[str, list[int]] = {}
    for _, o in outputs:
        assert o.request_id not in ends, "output after the end"
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            ends.setdefault(o.request_id, []).append(o.finish_reason)
    assert sorted(ends) == sorted(reqs)
    for rid, (r, _, _) in reqs.items():
        assert len(ends[rid]) == 1
        if ends[rid] == ["length"]:
            assert tokens[rid] == [token(rid, k) for k in range(r.max_tokens)]
        else:
            assert ends[rid] == ["abort"] and len(tokens.get(rid, [])) < r.max_tokens
    assert (core.pool.used, core.pool.available) == (0, core.pool.total)
    assert core.seqs == {} and not core.running and not core.waiting


@settings(max_examples=30, deadline=None)
@given(mix=mixes, eng=engines)
def test_same_inputs_give_the_same_outputs(mix, eng):
    _, _, a, ea = simulate(mix, *eng)
    _, _, b, eb = simulate(mix, *eng)
    assert a == b and ea == eb


@settings(max_examples=50, deadline=None)
@given(mix=mixes, eng=engines)
def test_kv_events_replayed_reproduce_the_cached_set(mix, eng):
    core, _, _, events = simulate(mix, *eng)
    index: set[int] = set()
    for e in events:
        if isinstance(e, BlockStored):
            assert not set(e.block_hashes) & index
            index.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert set(e.block_hashes) <= index
            index.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            index.clear()
    assert index == set(core.pool.ref)
