"""SimEngineCore beyond the basics: victim choice, swap and auto preemption, the host KV tier,
the scheduling-policy seam and the decode-only phase, Mooncake-style replay; exact steps on
tiny engines, and per-tier properties (hypothesis)."""

from __future__ import annotations

import dataclasses
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.core import FILLER, SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES
from tokenyard.services.worker.sim.preemption import PreemptionMode, wants_swap
from tokenyard.services.worker.sim.scheduler import VllmPolicy
from tokenyard.shared import hashing
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored, Phase

from tests import builders

BS = 4
req = partial(builders.req, block_size=BS)


def engine(budget=64, max_seqs=8, blocks=64, host=0, mode="recompute", base="zero", policy=None) -> SimEngineCore:
    p = dataclasses.replace(PROFILES[base], max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    return SimEngineCore(p, BS, blocks, host_blocks=host, preemption_mode=mode, policy=policy)


def out(rid: str, pos: int, done: bool = False, cached: int = 0) -> EngineOutput:
    return EngineOutput(rid, [FILLER[(len(rid) + pos) % len(FILLER)]], done, "length" if done else None, cached)


def drain(core: SimEngineCore, limit: int = 500) -> list[EngineOutput]:
    outs = []
    while core.has_work():
        outs += core.step().outputs
        limit -= 1
        assert limit, "never drained"
    return outs


# ───────────────────────────── victims ─────────────────────────────


def test_the_lowest_priority_class_is_preempted_first_even_when_older():
    core = engine(blocks=4)
    core.add(req("a", tokens=list(range(7)), max_tokens=6, priority=3))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6, priority=1))
    core.step()
    core.step()
    # a needs its third block: the victim is a itself (P3), not the newer b (P1)
    assert core.step().outputs == [out("b", 2)]
    assert [s.rid for s in core.waiting] == ["a"] and core.preemptions == 1


def test_within_a_class_the_latest_arrival_goes():
    core = engine(blocks=5)
    core.add(req("a", tokens=list(range(4)), max_tokens=8))  # 1 block for its prompt
    core.step()
    core.step()  # a: 2 generated, 5 tokens: 2 blocks
    core.add(req("b", tokens=list(range(40, 48)), max_tokens=8))  # 2 blocks
    core.step()  # b prefills (1 generated); a decodes: 3 generated
    assert (core.seqs["a"].generated, core.seqs["b"].generated) == (3, 1)
    # next decode: a (6 tokens → 2 blocks, has 2) fine; b needs a third block (9 tokens): 1 free
    core.step()
    core.step()  # a: 7 tokens, 2 blocks; b: 10 tokens, 3 blocks; 5 used
    core.step()  # a at 8 tokens still fits; b 11: fits
    r = core.step()  # a needs its third block (9 tokens), none free: b arrived later → b goes
    assert [s.rid for s in core.waiting] == ["b"] and core.seqs["b"].target == 11  # re-prefills 8 + 3
    assert r.outputs == [out("a", 6)] and core.pool.available == 2  # b's 3 blocks back, a took one


def test_a_victim_scheduled_earlier_in_the_step_gives_its_tokens_back():
    core = engine(blocks=4)
    core.add(req("x", tokens=list(range(6)), max_tokens=6, priority=3))
    assert core.step().outputs == [out("x", 0)]  # x runs first, so it decodes first below
    core.add(req("y", tokens=list(range(50, 58)), max_tokens=6, priority=1))
    assert core.step().outputs == [out("y", 0), out("x", 1)]  # 2 blocks each, none free
    # x decodes first (8 tokens: no new block); y's 9th token needs a third block, none is
    # free: the victim is x (P3), already scheduled — its token goes back to the budget
    r = core.step()
    assert (r.outputs, r.scheduled_tokens) == ([out("y", 1)], 1)
    assert [s.rid for s in core.waiting] == ["x"] and core.seqs["x"].target == 8


def test_the_waiting_line_serves_the_higher_class_first_then_arrival_as_vllm_priority():
    core = engine(budget=8, max_seqs=1)
    for rid, prio in (("a", 2), ("b", 1), ("c", 2), ("d", 0)):
        core.add(req(rid, tokens=list(range(ord(rid), ord(rid) + 4)), max_tokens=1, priority=prio))
    order = [o.request_id for o in drain(core) if o.finished]
    assert order == ["d", "b", "a", "c"]


def test_one_preemption_rule_lowest_class_then_latest_arrival():
    from tokenyard.services.worker.sim.core import Seq
    from tokenyard.services.worker.sim.scheduler import preemption_victim

    a, b, c, d = (Seq(req(r, tokens=[1], max_tokens=4, priority=p), i) for i, (r, p) in enumerate((("a", 3), ("b", 1), ("c", 3), ("d", 2))))
    c.generated = 0
    a.generated = 3  # tokens generated do not matter
    assert preemption_victim([a, b, c, d]).rid == "c"
    assert preemption_victim([a, b, d]).rid == "a"
    assert preemption_victim([b, d]).rid == "d"


# ───────────────────────────── swap ─────────────────────────────


def test_swap_keeps_the_victims_kv_in_the_host_tier_and_resumes_without_prefill():
    core = engine(blocks=4, host=8, mode="swap")
    core.add(req("a", tokens=list(range(7)), max_tokens=6))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    core.step()
    core.step()
    r = core.step()  # a needs a block: b (newest) is swapped out with its 8 computed tokens
    assert r.outputs == [out("a", 2)]
    b = core.seqs["b"]
    assert (b.swapped, b.computed, b.generated, core.swaps) == (2, 8, 2, 1)
    s = core.stats()
    assert (s.kv_host_blocks_used, s.kv_host_blocks_free) == (2, 6)
    outs = drain(core)
    # b resumed where it stopped: its remaining 4 tokens, no re-prefill
    assert [o for o in outs if o.request_id == "b"] == [out("b", k, done=k == 5) for k in range(2, 6)]
    # b's first prompt block was still cached on the GPU: only its second came back over the link
    assert (core.stats().kv_host_blocks_used, core.host.swapped) == (0, 0)


def test_swap_costs_the_transfer_in_both_steps():
    a100 = dataclasses.replace(PROFILES["a100-llama3-8b"], max_num_batched_tokens=64)
    core = SimEngineCore(a100, BS, 4, host_blocks=8, preemption_mode="swap")
    core.add(req("a", tokens=list(range(7)), max_tokens=6))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    core.step()
    core.step()
    r = core.step()  # swap-out of b's 8 tokens: 8 × 128 KiB at 25 GB/s
    assert r.duration_s == a100.step_s(1, 9, []) + 8 * 131072 / 25e9


def test_swap_without_host_room_falls_back_to_recompute():
    core = engine(blocks=4, host=1, mode="swap")
    core.add(req("a", tokens=list(range(7)), max_tokens=6))
    core.add(req("b", tokens=list(range(50, 57)), max_tokens=6))
    core.step()
    core.step()
    core.step()
    b = core.seqs["b"]
    assert (b.swapped, b.computed, b.target, core.swaps, core.preemptions) == (0, 0, 9, 0, 1)


def test_auto_swaps_when_the_transfer_is_under_three_tenths_of_the_recompute():
    h100 = PROFILES["h100-llama3-8b"]
    assert wants_swap(PreemptionMode.AUTO, h100, 4096)  # ~11 ms vs ~104 ms (README)
    slow = dataclasses.replace(h100, host_link_bytes_per_s=1e9)  # 537 ms > 0.3 × 104 ms
    assert not wants_swap(PreemptionMode.AUTO, slow, 4096)
    assert not wants_swap(PreemptionMode.RECOMPUTE, h100, 4096)
    assert wants_swap(PreemptionMode.SWAP, slow, 4096)
    assert not wants_swap(PreemptionMode.SWAP, h100, 0)


# ───────────────────────────── host tier ─────────────────────────────


def test_evicted_prefix_blocks_are_demoted_and_promoted_back_on_a_hit():
    core = engine(blocks=4, host=4)
    a = list(range(8))
    core.add(req("a", tokens=a + [99], max_tokens=1))
    drain(core)
    core.add(req("c", tokens=list(range(40, 53)), max_tokens=1))  # 4 blocks: 2 free, and a's two cached ones
    drain(core)
    ca = hashing.hash_chain(a, BS)
    events = core.pool.drain_events()
    assert BlockRemoved([ca[1], ca[0]], medium="GPU") in events
    assert BlockStored([ca[1], ca[0]], None, [], BS, medium="CPU") in events
    assert core.host.match(ca, 0) == 2
    core.add(req("a2", tokens=a + [77], max_tokens=1))
    r = core.step()
    assert r.outputs == [out("a2", 0, done=True, cached=8)]
    assert r.scheduled_tokens == 1
    assert core.host_hits == 8
    stored = [e for e in core.pool.drain_events() if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert stored == [BlockStored(ca, None, a, BS, medium="GPU")]  # back on the GPU, with its tokens


def test_promotion_costs_the_host_link():
    a100 = dataclasses.replace(PROFILES["a100-llama3-8b"], max_num_batched_tokens=64)
    core = SimEngineCore(a100, BS, 4, host_blocks=4)
    a = list(range(8))
    core.add(req("a", tokens=a + [99], max_tokens=1))
    drain(core)
    core.add(req("c", tokens=list(range(40, 53)), max_tokens=1))
    drain(core)
    core.add(req("a2", tokens=a + [77], max_tokens=1))
    assert core.step().duration_s == a100.step_s(0, 0, [(1, 8)]) + 8 * 131072 / 25e9


def test_the_host_tier_evicts_its_least_recent_block():
    core = engine(blocks=3, host=2)
    for k, rid in enumerate("xyz"):
        core.add(req(rid, tokens=list(range(10 * k, 10 * k + 8)) + [5], max_tokens=1))
        drain(core)
    cx, cy = hashing.hash_chain(list(range(8)), BS), hashing.hash_chain(list(range(10, 18)), BS)
    events = core.pool.drain_events()
    assert BlockRemoved([cx[1], cx[0]], medium="CPU") in events
    assert list(core.host.lru) == [cy[1], cy[0]]


# ───────────────────────────── policy seam and phases ─────────────────────────────


class NoNewcomers(VllmPolicy):
    def admit(self, seq, core):
        return not core.running


class EveryOtherStep(VllmPolicy):
    """A credit-like batch: the running requests take turns."""

    def __init__(self):
        self.turn = 0

    def step_batch(self, running):
        self.turn += 1
        return running[self.turn % 2 :: 2]


def test_the_policy_decides_who_joins_the_running_set():
    core = engine(policy=NoNewcomers())
    core.add(req("a", tokens=[1, 2, 3], max_tokens=2))
    core.add(req("b", tokens=[4, 5, 6], max_tokens=2))
    assert core.step().outputs == [out("a", 0)]
    assert core.step().outputs == [out("a", 1, done=True)]
    assert core.step().outputs == [out("b", 0)]


def test_the_policy_decides_who_runs_in_a_step():
    core = engine(policy=EveryOtherStep())
    core.add(req("a", tokens=[1, 2, 3], max_tokens=3))
    core.add(req("b", tokens=[4, 5, 6], max_tokens=3))
    assert core.step().outputs == [out("a", 0), out("b", 0)]  # admitted: both prefill
    assert core.step().outputs == [out("a", 1)]
    assert core.step().outputs == [out("b", 1)]


def test_a_decode_phase_schedules_no_prefill():
    core = engine(budget=4)
    core.add(req("a", tokens=[1, 2, 3], max_tokens=4))
    core.add(req("b", tokens=list(range(10, 20)), max_tokens=2))
    core.step()  # a prefilled (3) + 1 token of b's prompt
    core.set_phase(Phase.DECODE)
    for k in range(1, 4):
        r = core.step()
        assert r.outputs == [out("a", k, done=k == 3)] and r.scheduled_tokens == 1
    assert core.step().outputs == [] and core.has_work()  # b waits for a prefill phase
    core.set_phase(Phase.PREFILL)
    assert drain(core)[-1] == out("b", 1, done=True)


# ───────────────────────────── Mooncake replay ─────────────────────────────


def test_mooncake_style_requests_with_512_token_blocks_and_no_text():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], block_size=512)
    # trace rows: 1200 tokens over ids [0, 1, 2] (the last a partial block), then a turn sharing 0, 1
    core.add(builders.req("t0", 1200, 3, 1, chain=hashing.ids_chain([0, 1, 2]), block_size=512, reply_to=""))
    outs = drain(core)
    assert outs[-1].finished and outs[-1].num_cached_tokens == 0
    stored = [e for e in core.pool.drain_events() if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == hashing.ids_chain([0, 1])
    assert all(e.token_ids == [] and e.block_size == 512 for e in stored)
    core.add(builders.req("t1", 1900, 2, 1, chain=hashing.ids_chain([0, 1, 7, 8]), block_size=512, reply_to=""))
    assert drain(core)[-1] == EngineOutput("t1", [FILLER[(2 + 1) % len(FILLER)]], True, "length", 1024)


# ───────────────────────────── properties, per tier ─────────────────────────────

PREFIXES = [list(range(8)), list(range(50, 54)), []]
mixes = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 9), st.integers(1, 6), st.integers(0, 12),
              st.one_of(st.none(), st.integers(0, 15)), st.integers(0, 3)),
    min_size=1, max_size=10,
)
engines = st.tuples(st.integers(4, 24), st.integers(1, 4), st.integers(6, 16), st.integers(0, 6),
                    st.sampled_from(["recompute", "swap", "auto"]))


def run(mix, budget, max_seqs, blocks, host, mode):
    core = SimEngineCore(dataclasses.replace(PROFILES["a100-llama3-8b"], max_num_batched_tokens=budget,
                                             max_num_seqs=max_seqs), BS, blocks, host_blocks=host,
                         preemption_mode=mode)
    reqs = {f"r{k}": (req(f"r{k}", tokens=PREFIXES[p] + [1000 + 10 * k + j for j in range(own)], max_tokens=mt, priority=prio), at, ab)
            for k, (p, own, mt, at, ab, prio) in enumerate(mix)}
    trace, events = [], []
    step = 0
    while step <= 16 or core.has_work():
        for rid, (r, at, ab) in reqs.items():
            if at == step:
                core.add(r)
            if ab == step and ab >= at:
                core.abort(rid)
        res = core.step()
        trace.append((res.duration_s, res.outputs))
        events += core.pool.drain_events()
        pool, h = core.pool, core.host
        assert pool.free + pool.private + len(pool.ref) == pool.total  # GPU tier
        assert all(n >= 0 for n in pool.ref.values()) and pool.free >= 0
        assert len(h.lru) + h.swapped + h.free == h.capacity and h.free >= 0 and not h.pinned  # host tier
        assert h.swapped == sum(s.swapped for s in core.seqs.values())
        step += 1
        assert step < 600, "never drained"
    return core, reqs, trace, events


@settings(max_examples=60, deadline=None)
@given(mix=mixes, eng=engines)
def test_tiers_conserve_blocks_every_request_ends_once_and_events_mirror_each_tier(mix, eng):
    core, reqs, trace, events = run(mix, *eng)
    ends: dict[str, int] = {}
    for _, outs in trace:
        for o in outs:
            assert o.request_id not in ends, "output after the end"
            if o.finished:
                ends[o.request_id] = 1
    assert sorted(ends) == sorted(reqs)
    assert (core.pool.used, core.host.swapped) == (0, 0)
    index: dict[str, set[int]] = {"GPU": set(), "CPU": set()}
    for e in events:
        if isinstance(e, BlockStored):
            assert not set(e.block_hashes) & index[e.medium]
            index[e.medium].update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            assert set(e.block_hashes) <= index[e.medium]
            index[e.medium].difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            index["GPU"].clear()
    assert index["GPU"] == set(core.pool.ref)
    assert index["CPU"] == set(core.host.lru)


@settings(max_examples=25, deadline=None)
@given(mix=mixes, eng=engines)
def test_the_same_inputs_give_the_same_trace_in_every_mode(mix, eng):
    _, _, a, ea = run(mix, *eng)
    _, _, b, eb = run(mix, *eng)
    assert a == b and ea == eb


# ───────────────────────────── settings and reset ─────────────────────────────


def test_the_worker_flags_configure_the_simulated_engine():
    from types import SimpleNamespace

    from tokenyard.services.worker.sim.settings import sim_core

    h100 = PROFILES["h100-llama3-8b"]
    args = SimpleNamespace(kv_cache_dtype="fp8_e4m3", quantization="fp8_per_block", kv_offload_gb=4.0,
                           preemption_mode="auto", max_num_seqs=64, max_num_batched_tokens=None, num_blocks=None)
    core = sim_core(h100, 16, args)
    assert core.prof.kv_bytes_per_token == 65536 and core.prof.linear_factor == 0.625
    assert core.host.capacity == 4_000_000_000 // (65536 * 16) == 3814
    assert core.pool.total == core.prof.kv_capacity_tokens // 16
    assert (core.prof.max_num_seqs, core.prof.max_num_batched_tokens) == (64, 8192)
    assert core.preemption_mode is PreemptionMode.AUTO
    plain = sim_core(h100, 16, SimpleNamespace())
    assert (plain.prof, plain.host.capacity, plain.preemption_mode) == (h100, 0, PreemptionMode.RECOMPUTE)


def test_reset_prefix_cache_forgets_both_tiers():
    core = engine(blocks=3, host=2)
    core.add(req("x", tokens=list(range(8)) + [5], max_tokens=1))
    drain(core)
    core.add(req("y", tokens=list(range(10, 18)) + [5], max_tokens=1))
    drain(core)
    core.pool.drain_events()
    core.reset_prefix_cache()
    cx = hashing.hash_chain(list(range(8)), BS)
    # y's blocks were the GPU's last: all cleared there; x's were demoted to the host tier
    assert core.pool.drain_events() == [AllBlocksCleared(), BlockRemoved([cx[1], cx[0]], medium="CPU")]
    assert not core.pool.ref and not core.host.lru


def test_a_worker_at_speed_reports_the_costs_it_runs_at():
    """`tokenyard worker --speed 0.1` is a GPU ten times slower: its steps take 10 × the
    profile's time, and its heartbeat says so, so the queue's flow control and admission judge
    it in the wall-clock terms its clients see (reported in simulated time, a speed-0.1 fleet
    let its batch grow to 165 sequences a worker at 10 × its TPOT SLO under overload)."""
    from types import SimpleNamespace

    import pytest
    from tokenyard.services.worker.sim.settings import sim_core

    h100 = PROFILES["h100-llama3-8b"]
    base, slow = sim_core(h100, 16, SimpleNamespace()), sim_core(h100, 16, SimpleNamespace(speed=0.1))
    assert slow.stats().prefill_ms_per_token == pytest.approx(10 * base.stats().prefill_ms_per_token)
    assert slow.prof.step_s(8, 8000, [(512, 0)]) == pytest.approx(10 * base.prof.step_s(8, 8000, [(512, 0)]))
    assert slow.prof.transfer_s(1000) == pytest.approx(10 * base.prof.transfer_s(1000))
    moe = PROFILES["h100-qwen3-30b-a3b"]
    assert moe.at_speed(0.5).step_s(4, 400, []) == pytest.approx(2 * moe.step_s(4, 400, []))
