"""`tokenyard bench router`: chains cut from a Mooncake-format trace keep its prefix sharing,
the index is filled to the asked size before timing, and the JSON carries p50_us / p99_us."""

from __future__ import annotations

import json

import numpy as np
from tokenyard.loadgen.router_bench import load_chains, run_router_bench, splitmix64

from tokenyard.cli import main as tokenyard_main

ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 1536, "output_length": 7, "hash_ids": [0, 1, 3]},
    {"timestamp": 9, "input_length": 40, "output_length": 1, "hash_ids": [9]},
]


def trace(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return p


def test_chains_cut_each_512_token_id_into_blocks_and_keep_shared_prefixes(tmp_path):
    chains = load_chains(trace(tmp_path), 16)
    assert [(p, o, len(c)) for p, o, c in chains] == [(1100, 5, 68), (1536, 7, 96), (40, 1, 2)]
    a, b = chains[0][2], chains[1][2]
    assert a[:64] == b[:64] and a[64] != b[64]  # ids 0, 1 shared: 2 × 32 blocks
    assert a[:3] == splitmix64(np.array([0, 1, 2])).tolist()
    assert len(set(a) | set(b)) == 64 + 4 + 32
    assert [len(c) for _, _, c in load_chains(trace(tmp_path), 512)] == [2, 3, 0]


def test_the_index_is_filled_before_timing(tmp_path):
    r = run_router_bench(8, blocks=500, decisions=51, block_tokens=16, trace=trace(tmp_path), repeats=3)
    assert (r.decisions, r.instances, r.repeats) == (51, 8, 3)
    assert 500 <= r.index_blocks < 500 + 96  # filled, then not by more than one request's chain
    assert 0 < r.p50_us <= r.p99_us <= r.max_us
    assert 0 < r.floor_p50_us <= r.floor_p99_us
    assert r.mean_chain_blocks == round((68 + 96 + 2) / 3, 1)  # the timed requests cycle the trace


def test_the_cli_prints_json(tmp_path, capsys):
    rc = tokenyard_main(
        ["bench", "router", "--instances", "4", "--blocks", "200", "--decisions", "20", "--json",
         "--trace", str(trace(tmp_path)), "--policy", "dynamo"]
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {
        "p50_us",
        "p99_us",
        "cpu_p50_us",
        "cpu_p99_us",
        "floor_p50_us",
        "floor_p99_us",
        "index_blocks",
    } <= set(out)
    assert (out["policy"], out["instances"], out["decisions"]) == ("dynamo", 4, 20)
    assert tokenyard_main(["bench", "router", "--instances", "0"]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps(ROWS[2]) + "\n")  # 40 tokens: no full 512-token block
    assert (
        tokenyard_main(
            ["bench", "router", "--instances", "2", "--block-tokens", "512", "--trace", str(empty)]
        )
        == 2
    )
    assert (
        tokenyard_main(["bench", "router", "--instances", "2", "--trace", str(tmp_path / "none.jsonl")]) == 2
    )
