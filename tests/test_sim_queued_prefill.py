"""The simulated engine's backlog as its heartbeat reports it: queued_prefill_tokens and the
per-class split queued_prefill_ahead count the prompt tokens not yet prefilled (a waiting
request whole, as vLLM's own count); queued_prefill_ahead_net the prefill the engine will run
first — each waiting request net of the prefix it finds cached now, the hit its admission
takes (what the worker's `saturated` ahead term weighs)."""

from __future__ import annotations

import dataclasses

from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES

from tests import builders

BS = 4


def engine(budget: int = 64) -> SimEngineCore:
    prof = dataclasses.replace(PROFILES["zero"], max_num_batched_tokens=budget, max_num_seqs=8)
    return SimEngineCore(prof, block_size=BS, num_blocks=64)


def test_a_waiting_turn_counts_its_cached_prefix_in_the_gross_split_but_not_in_the_net_one():
    core = engine()
    first = list(range(20))
    core.add(builders.req("t1", tokens=first, max_tokens=1, block_size=BS))
    while core.has_work():
        core.step()  # turn 1 done: its 5 full blocks stay cached
    second = first + list(range(100, 112))  # turn 2: turn 1's 20 tokens, 12 new
    core.add(builders.req("t2", tokens=second, max_tokens=2, block_size=BS))
    core.add(builders.req("x", tokens=list(range(200, 210)), max_tokens=2, block_size=BS, priority=2))
    s = core.stats()
    assert s.queued_prefill_tokens == 32 + 10
    assert s.queued_prefill_ahead == [0, 32, 32 + 10, 32 + 10]
    assert s.queued_prefill_ahead_net == [0, 12, 12 + 10, 12 + 10]
    core.step()  # both admitted: the three agree again once running
    assert core.seqs["t2"].cached_tokens == 20
    s = core.stats()
    assert s.queued_prefill_ahead_net[-1] == s.queued_prefill_ahead[-1] == s.queued_prefill_tokens == 0


def test_a_whole_prompt_cached_still_leaves_its_last_token_to_compute():
    core = engine()
    toks = list(range(16))
    core.add(builders.req("a", tokens=toks, max_tokens=1, block_size=BS))
    while core.has_work():
        core.step()
    core.add(builders.req("b", tokens=toks, max_tokens=1, block_size=BS))
    # vLLM computes at least the last token: a full hit gives back its last block (4 tokens)
    assert core.stats().queued_prefill_ahead_net == [0, 4, 4, 4]
    assert core.stats().queued_prefill_ahead == [0, 16, 16, 16]
    assert core.stats().queued_prefill_tokens == 16
