"""The simulated engine's step shapes (issue 13, services/worker/sim/phases.py): vLLM without
chunked prefill, EcoServe's prefill-only phase, and spatial P/D's hand-off and decode leg —
on tiny engines with exact expected steps, and token conservation across a hand-off."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES
from tokenyard.shared.schemas import AdmittedRequest, Phase

from tests import builders

BS = 4


def engine(budget: int = 8, blocks: int = 64, **opts) -> SimEngineCore:
    prof = dataclasses.replace(PROFILES["zero"], max_num_batched_tokens=budget, max_num_seqs=8)
    return SimEngineCore(prof, block_size=BS, num_blocks=blocks, **opts)


def req(rid: str, n: int, max_tokens: int, base: int = 0) -> AdmittedRequest:
    return builders.req(rid, tokens=range(base, base + n), max_tokens=max_tokens, block_size=BS)


def emitted(res) -> dict[str, int]:
    return {o.request_id: len(o.new_token_ids) for o in res.outputs if o.new_token_ids}


def test_without_chunked_prefill_a_step_prefills_whole_prompts_or_decodes():
    core = engine(budget=8, chunked_prefill=False, max_model_len=32)
    core.add(req("a", 6, 3))
    assert emitted(core.step()) == {"a": 1}  # a's 6 tokens whole
    core.add(req("b", 20, 3, base=100))  # longer than the budget of 8: still whole
    res = core.step()
    assert emitted(res) == {"b": 1} and res.scheduled_tokens == 20  # prefill first: a waits
    assert emitted(core.step()) == {"a": 1, "b": 1}  # nothing waits: both decode
    core.add(req("c", 24, 3, base=200))
    core.add(req("d", 12, 3, base=300))  # c + d = 36 > max_model_len 32: d waits a step
    res = core.step()
    assert emitted(res) == {"c": 1} and res.scheduled_tokens == 24
    res = core.step()
    assert emitted(res) == {"d": 1} and res.scheduled_tokens == 12


def test_chunked_prefill_mixes_a_chunk_with_the_decodes():
    core = engine(budget=8)
    core.add(req("a", 6, 3))
    core.step()
    core.add(req("b", 20, 3, base=100))
    res = core.step()
    assert emitted(res) == {"a": 1} and res.scheduled_tokens == 8  # a's decode + 7 of b's prompt


def test_prefill_only_phase_stalls_decodes_while_a_prompt_is_left():
    core = engine(budget=8, prefill_only_phase=True)
    core.add(req("a", 4, 5))
    core.set_phase(Phase.PREFILL)
    assert emitted(core.step()) == {"a": 1}
    core.add(req("b", 12, 5, base=100))
    assert emitted(core.step()) == {}  # b: 8 of 12, a stalls
    assert emitted(core.step()) == {"b": 1}  # b: last 4, a still stalls
    assert emitted(core.step()) == {"a": 1, "b": 1}  # no prompt left: the decodes run
    core.set_phase(Phase.DECODE)
    core.add(req("c", 4, 2, base=200))
    assert emitted(core.step()) == {"a": 1, "b": 1}  # the decode phase takes no prefill
    core.set_phase(Phase.MIXED)
    assert emitted(core.step()) == {"a": 1, "b": 1, "c": 1}  # mixed: as before


def test_a_prefill_instance_hands_a_request_off_after_its_first_token():
    p = engine(budget=16, blocks=16, hand_off=True)
    p.add(req("a", 10, 4))
    res = p.step()
    assert emitted(res) == {"a": 1} and not res.outputs[0].finished
    assert [(r.request_id, cached) for r, cached in p.handed_off] == [("a", 0)]
    assert not p.has_work() and p.pool.used == 0  # its KV left; the full prompt blocks stay cached
    assert p.pool.available == 16 and len(p.pool.lru) == 2


def test_a_decode_instance_takes_the_kv_and_makes_the_remaining_tokens():
    d = engine(budget=16, blocks=16)
    d.add_prefilled(req("a", 10, 4), cached_tokens=8)
    assert d.stats().queued_prefill_tokens == 0
    res = d.step()
    assert emitted(res) == {"a": 1} and res.scheduled_tokens == 1  # its 2nd token, no prefill
    assert d.pool.used == 3  # ⌈(10 + 1) / 4⌉
    d.step()
    res = d.step()
    assert res.outputs[0].finished and res.outputs[0].num_cached_tokens == 8
    assert d.pool.used == 0


def test_a_decode_leg_waits_for_room():
    d = engine(budget=16, blocks=5)
    d.add_prefilled(req("a", 10, 2))
    d.add_prefilled(req("b", 10, 2, base=100))  # a takes 3 of 5 blocks: b waits
    assert emitted(d.step()) == {"a": 1}  # a's last token: done, its blocks back
    assert d.stats().waiting == 1
    assert emitted(d.step()) == {"b": 1}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(2, 9)), min_size=1, max_size=8), st.booleans())
def test_every_token_is_made_once_across_a_hand_off(specs, chunked):
    """Prefill instance then decode instance: each request gets exactly max_tokens tokens, and
    both pools end with nothing held."""
    p = engine(budget=16, blocks=64, hand_off=True, chunked_prefill=chunked, max_model_len=64)
    d = engine(budget=16, blocks=64)
    made: dict[str, int] = {}
    for i, (n, m) in enumerate(specs):
        p.add(req(f"r{i}", n, m, base=1000 * i))
    for _ in range(1000):
        if not (p.has_work() or d.has_work()):
            break
        for core in (p, d):
            if core.has_work():
                for rid, k in emitted(core.step()).items():
                    made[rid] = made.get(rid, 0) + k
        for r, cached in p.handed_off:
            d.add_prefilled(r, cached)
        p.handed_off.clear()
    assert made == {f"r{i}": m for i, (_, m) in enumerate(specs)}
    assert p.pool.used == 0 and d.pool.used == 0
