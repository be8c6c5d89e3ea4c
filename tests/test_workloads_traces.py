"""Trace readers on small hand-written files (exact values), plain and gzip; the shipped traces
(data/traces) against the figures of their README; the one workload registry, every name
opened by the simulator's and bench serve's paths alike."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.workload import make_workload
from tokenyard.loadgen.workloads import (
    WORKLOADS,
    AzureTrace,
    MooncakeTrace,
    is_trace,
    open_workload,
    prefix_hit_bound,
    trace_rate,
    workload_help,
)


@pytest.fixture
def mooncake(tmp_path) -> Path:
    rows = [
        {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 2]},
        {"timestamp": 4000, "input_length": 300, "output_length": 7, "hash_ids": [3]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_mooncake_reader_exact(mooncake):
    items = MooncakeTrace(mooncake).items()
    assert [(r.arrival_s, r.prompt_len, r.max_tokens, r.block_ids, r.priority) for r in items] == [
        (0.0, 600, 5, (0, 1), 1),
        (0.0, 1100, 1, (0, 1, 2), 1),  # an output length of 0 still asks for one token
        (3.0, 300, 7, (3,), 1),
    ]
    # Request 1 hits block 0 (block 1 of request 0 was partial: never cached).
    assert prefix_hit_bound(items, 512) == 512 / 2000


def test_scaling_and_prefixes(mooncake):
    assert [r.arrival_s for r in MooncakeTrace(mooncake, rate_scale=2.0).items()] == [0.0, 0.0, 1.5]
    assert [r.arrival_s for r in MooncakeTrace(mooncake, time_scale=2.0).items()] == [0.0, 0.0, 6.0]
    assert len(MooncakeTrace(mooncake, max_requests=2).items()) == 2
    assert len(MooncakeTrace(mooncake, duration_s=3.0).items()) == 2
    assert trace_rate(MooncakeTrace(mooncake).items()) == pytest.approx(2 / 3)
    mixed = MooncakeTrace(mooncake, priority_mix=(1, 1, 1, 1), seed=5).items()
    assert [r.priority for r in mixed] == [r.priority for r in MooncakeTrace(mooncake, priority_mix=(1, 1, 1, 1), seed=5).items()]


def test_skip_requests_starts_the_trace_later_and_its_clock_there(mooncake):
    items = MooncakeTrace(mooncake, skip_requests=1).items()
    assert [(r.index, r.arrival_s, r.prompt_len) for r in items] == [(0, 0.0, 1100), (1, 3.0, 300)]
    assert [r.prompt_len for r in open_workload(f"trace:{mooncake}", skip_requests=2, num_requests=5).items()] == [300]
    assert MooncakeTrace(mooncake, skip_requests=3).items() == []
    with pytest.raises(ValueError, match="skip_requests must be >= 0"):
        MooncakeTrace(mooncake, skip_requests=-1)
    with pytest.raises(ValueError, match="traces only"):
        open_workload("chatbot", skip_requests=1)


def test_mooncake_rejects_short_hash_ids(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [0]}) + "\n")
    with pytest.raises(ValueError, match="cannot cover"):
        MooncakeTrace(p).items()


def test_azure_reader_has_no_shared_prefixes(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,40,3\n"
        "2023-11-16 18:15:47.1805900,16,9\n"
    )
    items = AzureTrace(p).items()
    assert [(r.arrival_s, r.prompt_len, r.max_tokens, r.block_ids) for r in items] == [
        (0.0, 40, 3, (0, 1, 2)),
        (0.5, 16, 9, (3,)),
    ]
    assert prefix_hit_bound(items, 16) == 0.0


def test_open_workload_errors(mooncake):
    with pytest.raises(ValueError, match="own rate"):
        open_workload(f"trace:{mooncake}", rate=3.0)
    other = mooncake.with_name("t.txt")
    other.write_text("")
    with pytest.raises(ValueError, match="unknown trace format"):
        open_workload(f"trace:{other}")
    with pytest.raises(ValueError, match="unknown workload"):
        open_workload("chatbot:x")


def test_live_trace_replay_text(mooncake):
    """bench serve --workload trace:PATH: prompt text of the trace's lengths, equal ids equal text."""
    reqs = list(make_workload(BenchConfig(workload=f"trace:{mooncake}", num_prompts=3)).requests())
    assert [len(r.prompt) for r in reqs] == [600, 1100, 300]
    assert reqs[0].prompt == reqs[1].prompt[:600]
    assert reqs[2].prompt[:300] != reqs[0].prompt[:300]
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 3.0]


def test_gzip_file_reads_as_the_plain_one(mooncake):
    packed = mooncake.with_name("t.jsonl.gz")
    packed.write_bytes(gzip.compress(mooncake.read_bytes()))
    assert MooncakeTrace(packed).items() == MooncakeTrace(mooncake).items()
    assert open_workload(f"trace:{packed}").items() == MooncakeTrace(mooncake).items()


def test_shipped_traces_match_their_readme():
    """data/traces/README.md: records, span and rate of each file; Mooncake's prefix bound."""
    mooncake = open_workload("mooncake").items()
    assert len(mooncake) == 12031
    assert mooncake[-1].arrival_s == 3536.999
    assert round(prefix_hit_bound(mooncake, 512), 4) == 0.3734
    assert round(trace_rate(mooncake), 2) == 3.40
    code, conv = open_workload("azure-code").items(), open_workload("azure-conv").items()
    assert (len(code), len(conv)) == (8819, 19366)
    assert (round(trace_rate(code), 1), round(trace_rate(conv), 1)) == (2.6, 5.5)
    assert prefix_hit_bound(code[:500], 16) == 0.0


def test_one_registry_every_name_opens_for_the_simulator_and_for_bench_serve(mooncake):
    assert workload_help().split(" | ") == [*(n for n in WORKLOADS if n != "trace"), "trace:PATH"]
    for name in WORKLOADS:
        spec = f"trace:{mooncake}" if name == "trace" else name
        sim = open_workload(spec, num_requests=3)
        assert len(sim.items()) == 3 and all(r.prompt_len >= 1 and r.block_ids for r in sim.items())
        bench = list(make_workload(BenchConfig(workload=spec, num_prompts=3)).requests())
        assert [r.prompt_len for r in bench] == [r.prompt_len for r in sim.items()]
        assert all(len(r.prompt) == r.prompt_len for r in bench)
        assert is_trace(spec) == (name in ("mooncake", "azure-code", "azure-conv", "azure-code-prefix", "azure-conv-prefix", "trace"))
    with pytest.raises(ValueError, match="heavy-tail"):  # the error lists every name
        make_workload(BenchConfig(workload="bogus"))


def test_synthetic_block_form_has_the_text_forms_lengths_and_arrivals():
    sim = open_workload("synthetic", num_requests=50, input_len=100, output_len=20, range_ratio=0.5, rate=8.0, seed=2)
    bench = list(make_workload(BenchConfig(workload="synthetic", num_prompts=50, input_len=100, output_len=20,
                                           range_ratio=0.5, rate=8.0, seed=2)).requests())
    assert [(r.prompt_len, r.max_tokens, r.arrival_s) for r in sim.items()] == [
        (r.prompt_len, r.max_tokens, r.arrival_s) for r in bench
    ]
    ids = [b for r in sim.items() for b in r.block_ids]
    assert len(ids) == len(set(ids)) == sum(math.ceil(r.prompt_len / 16) for r in sim.items())
