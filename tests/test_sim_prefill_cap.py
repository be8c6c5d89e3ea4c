"""The simulated engine's per-request prefill chunk cap, vLLM's `long_prefill_token_threshold`
(vllm/v1/core/sched/scheduler.py): while more than one request is running or waiting, no
request prefills more than the threshold in a step, running and newly admitted ones alike;
alone, a request takes the whole budget; 0 is no cap, the default of both engines
(services/worker/engine.DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD says why)."""

from __future__ import annotations

import dataclasses
from functools import partial
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES, LatencyProfile

from tests import builders

BS = 4
req = partial(builders.req, block_size=BS)


class Recording(SimEngineCore):
    """The real engine, noting each prefill chunk a step computes: (request id, tokens)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.chunks: list[tuple[str, int]] = []

    def advance_prefill(self, seq, n, outputs):
        self.chunks.append((seq.rid, n))
        super().advance_prefill(seq, n, outputs)


def prof(budget: int = 16, cap: int = 4, max_seqs: int = 8, base: str = "zero") -> LatencyProfile:
    return dataclasses.replace(PROFILES[base], max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                               long_prefill_token_threshold=cap)


def engine(budget: int = 16, cap: int = 4, max_seqs: int = 8, blocks: int = 128, **opts) -> Recording:
    return Recording(prof(budget, cap, max_seqs), block_size=BS, num_blocks=blocks, **opts)


def step(core: Recording) -> tuple[dict[str, int], set[str]]:
    """One step: the prefill tokens each request computed in it, and who emitted a token."""
    core.chunks = []
    r = core.step()
    return dict(core.chunks), {o.request_id for o in r.outputs if o.new_token_ids}


def long_prompt(n: int = 40) -> list[int]:
    return list(range(n))


def test_a_long_prompt_leaves_room_for_a_short_one():
    core = engine(budget=16, cap=4)
    core.add(req("long", tokens=long_prompt(40), max_tokens=4))
    assert step(core) == ({"long": 16}, set())  # alone: the whole budget
    core.add(req("s", tokens=[900, 901, 902], max_tokens=4))
    # two in the engine: the long prompt gets 4, the short one its whole prompt beside it
    assert step(core) == ({"long": 4, "s": 3}, {"s"})
    assert step(core) == ({"long": 4}, {"s"})  # s decodes (1 token), long 4 more
    assert core.seqs["long"].computed == 24


def test_without_the_cap_the_short_prompt_waits_for_the_whole_long_prefill():
    core = engine(budget=16, cap=0)
    core.add(req("long", tokens=long_prompt(40), max_tokens=4))
    assert step(core) == ({"long": 16}, set())
    core.add(req("s", tokens=[900, 901, 902], max_tokens=4))
    assert step(core) == ({"long": 16}, set())  # the running prefill's chunk takes the budget
    assert step(core) == ({"long": 8, "s": 3}, {"long", "s"})  # only its last chunk leaves room


def test_a_short_request_joining_is_capped_too():
    core = engine(budget=16, cap=4)
    core.add(req("a", tokens=long_prompt(12), max_tokens=2))
    core.add(req("b", tokens=list(range(100, 110)), max_tokens=2))
    assert step(core) == ({"a": 4, "b": 4}, set())  # both capped; the budget is not filled
    assert step(core) == ({"a": 4, "b": 4}, set())
    assert step(core) == ({"a": 4, "b": 2}, {"a", "b"})


def test_a_waiting_request_counts_even_when_no_seat_is_free():
    """vLLM counts running + waiting requests, not the ones this step can schedule."""
    core = engine(budget=16, cap=4, max_seqs=1)
    core.add(req("long", tokens=long_prompt(40), max_tokens=2))
    core.add(req("s", tokens=[900, 901, 902], max_tokens=2))
    assert step(core) == ({"long": 4}, set())
    assert len(core.waiting) == 1


def test_once_the_others_leave_the_long_prompt_gets_the_budget_again():
    core = engine(budget=16, cap=4)
    core.add(req("long", tokens=long_prompt(40), max_tokens=2))
    core.add(req("s", tokens=[900, 901, 902], max_tokens=1))
    assert step(core) == ({"long": 4, "s": 3}, {"s"})  # s is done at its first token
    assert step(core) == ({"long": 16}, set())


def test_no_cap_without_chunked_prefill():
    core = engine(budget=16, cap=4, chunked_prefill=False)
    core.add(req("a", tokens=long_prompt(20), max_tokens=2))
    core.add(req("b", tokens=list(range(100, 106)), max_tokens=2))
    assert step(core) == ({"a": 20, "b": 6}, {"a", "b"})  # whole prompts, as without chunking


def test_no_cap_by_default_and_a_setting_sets_one():
    a100 = PROFILES["a100-llama3-8b"]
    assert a100.long_prefill_token_threshold == 0 and SimEngineCore(a100).prefill_cap == 0
    assert SimEngineCore(dataclasses.replace(a100, long_prefill_token_threshold=300)).prefill_cap == 300
    core = engine(budget=16, cap=0)
    core.add(req("a", tokens=long_prompt(20), max_tokens=2))
    core.add(req("b", tokens=list(range(100, 106)), max_tokens=2))
    assert step(core) == ({"a": 16}, set())  # the first in line takes the budget, as vLLM's default


def test_on_an_a100_a_short_prompt_behind_a_32k_prompt_starts_at_once():
    """What the cap is for: a 200-token prompt arriving one step into a 32k prefill gets its
    first token in the next step (~0.06 s) with a cap of 512 (a quarter of the budget), and
    after the whole long prefill (~4.7 s more) without; the long prompt's TTFT barely moves
    (a step's cost per token is flat above ~256 tokens)."""
    a100 = PROFILES["a100-llama3-8b"]

    def short_ttft(cap: int) -> tuple[int, float]:
        core = Recording(dataclasses.replace(a100, long_prefill_token_threshold=cap), block_size=16)
        core.add(req("long", tokens=long_prompt(32_768), max_tokens=2))
        core.step()
        core.add(req("s", tokens=list(range(100_000, 100_200)), max_tokens=2))
        t, n = 0.0, 0
        while True:
            r = core.step()
            t, n = t + r.duration_s, n + 1
            if any(o.request_id == "s" for o in r.outputs):
                return n, t

    n, t = short_ttft(512)
    assert n == 1 and 0.05 < t < 0.15  # one step: long 512 + short 200 tokens
    n, t = short_ttft(0)
    assert n == 16 and t > 4.0  # 15 more chunks of 2,048, then the short one's


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 4), st.integers(0, 6)), min_size=1, max_size=8),
    budget=st.integers(4, 32),
    cap=st.sampled_from([0, 1, 3, 7]),
    max_seqs=st.integers(1, 4),
)
def test_no_step_gives_a_request_more_than_the_cap_while_others_are_in(prompts, budget, cap, max_seqs):
    """Every step: the scheduled tokens stay within the budget; while more than one request is
    running or waiting, no prefill chunk exceeds the threshold; every request ends."""
    core = engine(budget=budget, cap=cap, max_seqs=max_seqs, blocks=64)
    limit = core.prefill_cap
    todo = [(at, req(f"r{k}", tokens=[1000 * (k + 1) + j for j in range(n)], max_tokens=mt))
            for k, (n, mt, at) in enumerate(prompts)]
    ended: set[str] = set()
    t = 0
    while t <= 6 or core.has_work():
        for at, r in todo:
            if at == t:
                core.add(r)
        crowded = len(core.running) + len(core.waiting) > 1
        core.chunks = []
        result = core.step()
        assert result.scheduled_tokens <= budget
        if crowded and limit:
            assert all(n <= limit for _, n in core.chunks), core.chunks
        ended |= {o.request_id for o in result.outputs if o.finished}
        t += 1
        assert t < 2000, "the engine never drained"
    assert ended == {r.request_id for _, r in todo}


# ───────────────────────────── the worker's flag, both engines ─────────────────────────────


def test_the_worker_flag_sets_the_simulated_engine_cap():
    import pytest
    from tokenyard.services.worker.sim.settings import sim_core

    a100 = PROFILES["a100-llama3-8b"]
    assert sim_core(a100, 16, SimpleNamespace()).prefill_cap == 0
    assert sim_core(a100, 16, SimpleNamespace(long_prefill_token_threshold=None)).prefill_cap == 0
    assert sim_core(a100, 16, SimpleNamespace(long_prefill_token_threshold=256)).prefill_cap == 256
    with pytest.raises(ValueError, match="must be ≥ 0"):
        sim_core(a100, 16, SimpleNamespace(long_prefill_token_threshold=-1))


def test_the_vllm_engine_gets_the_setting_under_vllms_name():
    import pytest
    from tokenyard.services.worker.vllm.settings import SettingsError, VllmSettings, engine_kwargs

    def threshold(**kw) -> int:
        return engine_kwargs(VllmSettings(model="/m", **kw), "cuda", "ipc:///tmp/x/kv")["long_prefill_token_threshold"]

    assert threshold() == 0  # no cap, as the simulated engine and vLLM's own default
    assert threshold(long_prefill_token_threshold=1000) == 1000
    # vLLM refuses a threshold above max_model_len
    assert threshold(long_prefill_token_threshold=1000, max_model_len=256) == 256
    with pytest.raises(SettingsError, match="must be ≥ 0"):
        threshold(long_prefill_token_threshold=-5)


def test_the_cluster_simulator_refuses_a_negative_threshold():
    import pytest
    from tokenyard.simulator.cluster import ClusterSim, SimConfig

    with pytest.raises(ValueError, match="must be ≥ 0"):
        ClusterSim(SimConfig(instances=1, long_prefill_token_threshold=-1), 16)
    sim = ClusterSim(SimConfig(instances=2, long_prefill_token_threshold=256), 16)
    assert [inst.engine.prefill_cap for inst in sim.instances] == [256, 256]
