"""The Azure traces' prefix model (loadgen/workloads/azure_prefix.py): exact structure on a
hand-made model, and its invariants as properties (lengths kept, seeded, continuations share
their session's whole context, new sessions share only a popular prefix)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import open_workload, prefix_hit_bound
from tokenyard.loadgen.workloads.azure_prefix import MODELS, PrefixModel, PrefixModeler

BS = 16


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_one_prefix_always_continuing_builds_one_conversation():
    """K = 1, p_continue = 1: every request extends the one session by its answer and a turn."""
    m = PrefixModel(prefixes=1, prefix_lo=32, prefix_hi=32, zipf_a=1.0, p_continue=1.0, window=4)
    modeler = PrefixModeler(m, BS, seed=0)
    first = modeler.ids(48, 16)  # new session: 32 prefix tokens + 16 own
    second = modeler.ids(96, 8)  # context 48 + 16 = 64 < 96: continues, 64 shared tokens
    third = modeler.ids(40, 8)  # 40 < 104: no session fits, a new one on the same prefix
    assert (len(first), len(second), len(third)) == (3, 6, 3)
    assert shared_blocks(first, second) == 3  # the whole first prompt (48 tokens = 3 blocks)
    assert shared_blocks(second, third) == 2  # the 32-token prefix only
    assert third[2] not in second


def test_shipped_models_give_hit_bounds_between_none_and_everything():
    """Seeded: the same seed gives the same prompts at any rate; a bound a router can chase."""
    for name in ("azure-conv-prefix", "azure-code-prefix"):
        a = open_workload(name, num_requests=400, seed=3).items()
        b = open_workload(name, num_requests=400, seed=3, rate_scale=2.0).items()
        plain = open_workload(name.removesuffix("-prefix"), num_requests=400).items()
        assert [r.block_ids for r in a] == [r.block_ids for r in b]
        assert [(r.prompt_len, r.max_tokens) for r in a] == [(r.prompt_len, r.max_tokens) for r in plain]
        assert [r.arrival_s * 2 for r in b] == [r.arrival_s for r in a]
        assert 0.2 < prefix_hit_bound(a, BS) < 0.8
        other = open_workload(name, num_requests=400, seed=4).items()
        assert [r.block_ids for r in other] != [r.block_ids for r in a]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 600), st.integers(1, 200)), min_size=1, max_size=40),
    st.integers(0, 2**16),
    st.sampled_from(sorted(MODELS)),
)
def test_every_prompt_keeps_its_length_and_shares_only_a_prefix_or_a_session(rows, seed, kind):
    m = MODELS[kind]
    modeler = PrefixModeler(m, BS, seed)
    seen: list[tuple[int, tuple[int, ...]]] = []
    for length, answer in rows:
        ids = modeler.ids(length, answer)
        assert len(ids) == math.ceil(length / BS)
        longest = max((shared_blocks(ids, old) for _, old in seen), default=0)
        # whatever is shared is a popular prefix (≤ prefix_hi tokens) or an earlier whole prompt
        assert longest * BS <= m.prefix_hi or any(
            shared_blocks(ids, old) >= n // BS for n, old in seen if shared_blocks(ids, old) == longest
        )
        seen.append((length, ids))
