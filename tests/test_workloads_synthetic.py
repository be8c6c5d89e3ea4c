"""Seed 000's synthetic workloads: same seed same workload; the rate moves arrivals only;
each workload has the prefix structure it promises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import (
    ApiWorkload,
    ChatBotWorkload,
    CoderWorkload,
    open_workload,
    prefix_hit_bound,
)


def test_exact_values_for_a_fixed_seed():
    """Pinned: a change here changes every simulated result in docs/RESULTS.md."""
    got = {
        c.name: [(r.prompt_len, r.max_tokens, len(r.block_ids)) for r in c(4, seed=7).items()]
        for c in (ChatBotWorkload, ApiWorkload, CoderWorkload)
    }
    assert got == {
        "chatbot": [(804, 245, 51), (983, 250, 62), (765, 132, 48), (503, 167, 32)],
        "api": [(1758, 119, 110), (1138, 23, 72), (1085, 60, 68), (1100, 47, 69)],
        "coder": [(6649, 250, 416), (6670, 196, 417), (10335, 278, 646), (10108, 182, 632)],
    }


@pytest.mark.parametrize("cls", [ChatBotWorkload, ApiWorkload, CoderWorkload])
def test_rate_scaling_moves_arrivals_only(cls):
    base = cls(120, seed=1).items()
    fast = cls(120, seed=1, rate_scale=2.0).items()
    slow = cls(120, seed=1, time_scale=3.0).items()
    assert [(r.prompt_len, r.max_tokens, r.block_ids) for r in fast] == [
        (r.prompt_len, r.max_tokens, r.block_ids) for r in base
    ]
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 2 for r in base])
    assert [r.arrival_s for r in slow] == pytest.approx([r.arrival_s * 3 for r in base])
    assert cls(120, seed=2).items() != base


def test_chatbot_turns_extend_the_previous_turn():
    items = ChatBotWorkload(400, rate=2.0, seed=3).items()  # 60 users: many turns each
    full = {r.index: r.block_ids[: r.prompt_len // 16] for r in items}
    extended = 0
    for r in items:
        for q in items[: r.index]:
            fq = full[q.index]
            # q's prompt + q's answer + a new message: r's leading blocks are q's full blocks.
            if len(fq) > 2 and r.prompt_len > q.prompt_len + q.max_tokens and r.block_ids[: len(fq)] == fq:
                extended += 1
                break
    assert extended > 100
    assert prefix_hit_bound(items, 16) > 0.5


def test_api_and_coder_share_few_long_prefixes():
    api = ApiWorkload(500, seed=0).items()
    coder = CoderWorkload(500, seed=0).items()
    assert len({r.block_ids[0] for r in api}) == 8  # eight system prompts
    assert len({r.block_ids[0] for r in coder}) <= 12  # twelve repositories
    assert prefix_hit_bound(api, 16) > 0.8 and prefix_hit_bound(coder, 16) > 0.9
    assert sum(r.prompt_len for r in coder) / 500 > 5 * sum(r.prompt_len for r in api) / 500


def test_duration_cut_and_open_workload():
    w = open_workload("coder", num_requests=200, seed=0, duration_s=2.0)
    assert w.items() and all(r.arrival_s < 2.0 for r in w.items())
    assert open_workload("api", num_requests=10).rate == ApiWorkload.DEFAULT_RATE


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["chatbot", "api", "coder"]), st.integers(0, 2**16), st.integers(1, 60))
def test_same_seed_same_workload_and_sane_requests(name, seed, n):
    a = open_workload(name, num_requests=n, seed=seed).items()
    assert a == open_workload(name, num_requests=n, seed=seed).items()
    for r in a:
        assert len(r.block_ids) == -(-r.prompt_len // 16)
        assert r.max_tokens >= 1 and r.prompt_len >= 1
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)
