"""Block-id workloads: ids name prefixes, text follows ids, the infinite-cache bound — exact
values on hand-built prompts, properties on generated ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import BlockText, PrefixIds, TraceRequest, prefix_hit_bound
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared.schemas import GenerateRequest
from tokenyard.shared.tokenizer import ByteTokenizer


def test_prefix_ids_share_exactly_the_blocks_of_shared_segments():
    ids = PrefixIds(4)
    a = ids.ids([("sys", 6), ("q1", 5)])  # blocks: [sys0-4) [sys4-6 q1 0-2) [q1 2-5)
    b = ids.ids([("sys", 6), ("q2", 5)])
    c = ids.ids([("sys", 6), ("q1", 5)])
    assert a == (0, 1, 2) and c == a
    assert b == (0, 3, 4)  # only the first block (all system prompt) is shared
    assert ids.ids([("sys", 8)]) == (0, 5)  # a full block sys[4:8) differs from sys[4:6)+q1


def test_prefix_hit_bound_exact():
    reqs = [
        TraceRequest(0, 0.0, 8, 1, 1, (0, 1)),
        TraceRequest(1, 1.0, 8, 1, 1, (0, 1)),  # full hit, but one token is always computed: 1 block
        TraceRequest(2, 2.0, 10, 1, 1, (0, 2, 3)),  # first block hit; the partial block never counts
    ]
    assert prefix_hit_bound(reqs, 4) == (0 + 4 + 4) / (8 + 8 + 10)
    assert prefix_hit_bound([], 4) == 0.0


def test_block_text_equal_ids_equal_tokens_at_admission():
    """Equal block ids ⇒ identical text ⇒ identical 16-token chain hashes at admission."""
    text = BlockText(32, seed=1)
    adm = AdmissionCore(AdmissionConfig(max_model_len=10_000), ByteTokenizer())
    p1, p2 = text.prompt((7, 8, 9), 80), text.prompt((7, 8, 11), 90)
    assert len(p1) == 80 and len(p2) == 90 and p1[:64] == p2[:64] and p1[64:80] != p2[64:80]
    h1 = adm.admit(GenerateRequest(prompt=p1), reply_to="x", json=False, headers=None, now=0, new_id="a").block_hashes
    h2 = adm.admit(GenerateRequest(prompt=p2), reply_to="x", json=False, headers=None, now=0, new_id="b").block_hashes
    assert h1[:4] == h2[:4] and h1[4] != h2[4]
    assert BlockText(32, seed=1).block(7) == text.block(7) and BlockText(32, seed=2).block(7) != text.block(7)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=4), min_size=1, max_size=12), st.integers(1, 5))
def test_prefix_ids_equal_prefix_iff_equal_ids(prompts, bs):
    """Two prompts (segments of length 3) share block j's id iff their tokens agree up to
    block j's end."""
    ids = PrefixIds(bs)
    seg = [[(k, 3) for k in p] for p in prompts]
    got = [ids.ids(s) for s in seg]
    tokens = [[(k, i) for k in p for i in range(3)] for p in prompts]
    for a in range(len(prompts)):
        assert len(got[a]) == -(-len(tokens[a]) // bs)
        for b in range(len(prompts)):
            for j in range(min(len(got[a]), len(got[b]))):
                end_a, end_b = min((j + 1) * bs, len(tokens[a])), min((j + 1) * bs, len(tokens[b]))
                same = end_a == end_b and tokens[a][:end_a] == tokens[b][:end_b]
                assert (got[a][j] == got[b][j]) == same
