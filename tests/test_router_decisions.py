"""The decision hot path is made cheaper without changing a decision: the router core, fed a
Mooncake trace prefix on a seeded fleet (tokenyard bench router's setup, smaller), makes the
same choices, with the same hit lengths, as recorded in tests/data/router_decisions.json.

The file was written by the code before the hot path was optimised (commit 1c0980c). A
policy changed on purpose changes its decisions: regenerate then, after checking that only
that policy's rows moved (last: the default's stall beyond the decodes' TPOT slack, with
the heartbeats' prefill cost and slack added, round 4):

    .venv/bin/python tests/test_router_decisions.py --write
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenyard.loadgen.router_bench import MODEL, TRACE, load_chains
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.shared.schemas import BlockStored, EngineStats, Heartbeat, KVEventBatch

from tests import builders

GOLDEN = Path(__file__).parent / "data" / "router_decisions.json"
POLICIES = ("marginal-latency", "multiplicative", "llmd-token-load", "sglang", "dynamo")
INSTANCES = 48
REQUESTS = 600
BLOCK_TOKENS = 16


@functools.cache
def trace_chains() -> list:
    return load_chains(TRACE, BLOCK_TOKENS)[:REQUESTS]


def decisions(policy: str) -> list[list]:
    """(worker id, hit tokens, candidates) of each of REQUESTS trace requests, each request's
    chain then stored on its worker as a KV event; heartbeats of seeded load every INSTANCES
    decisions."""
    chains = trace_chains()
    rng = np.random.default_rng(7)
    decode_rng = np.random.default_rng(8)  # its own stream: the other fields stay as first recorded
    core = RouterCore(RouterConfig(policy=policy, stale_after_s=1e9, forget_after_s=1e9, seed=0))
    wids = [f"w{i:03d}" for i in range(INSTANCES)]

    def heartbeats(now: float) -> None:
        running, queued = rng.integers(0, 65, INSTANCES), rng.integers(0, 16_001, INSTANCES)
        used = rng.integers(0, 20_000, INSTANCES)
        slack = decode_rng.uniform(0.0, 1_500.0, INSTANCES)  # the running decodes' TPOT slack, ms
        for i, w in enumerate(wids):
            stats = EngineStats(int(running[i]), int(running[i] // 8), int(queued[i]), int(used[i]),
                                27_343 - int(used[i]), BLOCK_TOKENS, prefill_ms_per_token=0.07,
                                tpot_slack_ms=float(slack[i]) if running[i] else None)
            core.on_heartbeat(Heartbeat(w, MODEL, 0, now, stats), now)

    out, now = [], 0.0
    for k, (plen, olen, chain) in enumerate(chains):
        if k % INSTANCES == 0:
            heartbeats(now)
        req = builders.req(f"r{k}", plen, olen, 1, model=MODEL, chain=chain, block_size=BLOCK_TOKENS, arrival_s=now, reply_to="")
        c = core.route(req, now)
        out.append([c.worker_id, c.hit_tokens, c.candidates])
        ev = BlockStored(block_hashes=chain, parent_block_hash=None, token_ids=[], block_size=BLOCK_TOKENS)
        core.on_kv_events(c.worker_id, KVEventBatch(now, [ev]), now)
        now += 0.05
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_decisions_on_a_trace_are_those_recorded(policy):
    want = json.loads(GOLDEN.read_text())[policy]
    got = decisions(policy)
    first = next((k for k, (g, w) in enumerate(zip(got, want, strict=True)) if g != w), None)
    assert first is None, f"{policy}: decision {first} differs: {got[first]} instead of {want[first]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps({p: decisions(p) for p in POLICIES}, separators=(",", ":")) + "\n")
