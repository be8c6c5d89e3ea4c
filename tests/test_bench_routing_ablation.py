"""bench/routing_ablation.py: its copy of the default (round 12: `-trq0`) is the router's default, round 9's idle
rule prices the stall whole where an idle candidate exists, and --reported puts a variant
beside the committed peers of each reported cell."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from bench import routing_ablation as ab
from bench import routing_sweep as sweep


def test_the_ablations_copy_of_the_default_decides_as_the_router_does(monkeypatch):
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.services.router import core
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    monkeypatch.setattr(core, "POLICIES", dict(core.POLICIES))  # the variant's registration ends with the test
    w = open_workload("chatbot", num_requests=150, rate_scale=2.0)
    runs = [simulate(w, SimConfig(instances=4, profile="a100-llama3-8b", policy=p), {"ttft": 2000.0, "tpot": 100.0})
            for p in (ab.router_policy("slackhalf-bl-stickyq-trq0"), sweep.DEFAULT)]
    keys = ("mean_ttft_ms", "p99_tpot_ms", "prefix_hit_ratio", "request_goodput", "duration")
    assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys]


def view(**rows):
    """Two candidates: 0 holds 400 of r's 1,000 tokens and runs 3 decodes far ahead of their TPOT
    SLO (their slack absorbs any prompt); 1 is idle and holds nothing."""
    base = dict(queued_prefill=np.array([0.0, 0.0]), new=np.array([600, 1000]), running=np.array([3, 0]),
                waiting=np.array([0, 0]), slack_ms=np.array([5000.0, np.nan]), ms_per_token=np.array([0.075, 0.075]),
                kv_used=np.array([0, 0]), kv_free=np.array([10**6, 10**6]), block_size=np.array([16, 16]))
    return SimpleNamespace(**(base | rows))


def test_the_idle_rule_prices_the_holders_stall_whole_while_a_candidate_is_idle():
    req = SimpleNamespace(max_tokens=16, prompt_len=1000)
    cand = np.array([0, 1])
    # shipped: 600 + 600·B̄/2 (B̄ = 1.5; i's own half absorbed) = 1,050 < the idle one's 1,000 + 750
    shipped = ab.VARIANTS["slackhalf-bl-stickyq"].score(req, view(), cand).scores
    assert shipped.tolist() == [1050.0, 1750.0]
    # idle rule: the holder's own half, 600·3/2 = 900, counts: 1,950 > 1,750, r goes to the idle one
    idle = ab.VARIANTS["slackidle-bl-stickyq"].score(req, view(), cand).scores
    assert idle.tolist() == [1950.0, 1750.0]
    # no idle candidate (something queued on 1): the slack absorbs as shipped
    busy = view(queued_prefill=np.array([0.0, 10.0]))
    assert ab.VARIANTS["slackidle-bl-stickyq"].score(req, busy, cand).scores.tolist() == \
        ab.VARIANTS["slackhalf-bl-stickyq"].score(req, busy, cand).scores.tolist() == [1050.0, 1760.0]


def test_reported_puts_the_variant_beside_the_committed_peers(tmp_path):
    peers, out = tmp_path / "peers", tmp_path / "out" / "least-loaded"
    peers.mkdir()
    peer = {"mean_ttft_ms": 1.0, "p99_tpot_ms": 1.0, "prefix_hit_ratio": 1.0, "request_goodput": 1e6, "failed": 0}
    cells = [(n, x) for n, w in sweep.WORKLOADS.items() if w[3] == "reported" for x in sweep.LOADS]
    for name, load in cells:
        (peers / f"{name}_x{load:g}.json").write_text(json.dumps(
            {"config": {"num_requests": 12}, "policies": {"dynamo": peer, sweep.DEFAULT: peer}}))
    text = ab.reported("least-loaded", "least-loaded", out, str(ab.TRACES), 12, peers)
    doc = json.loads((out / "api_x1.json").read_text())
    assert doc["policies"]["dynamo"] == peer  # the peer as committed
    assert doc["policies"][sweep.DEFAULT]["policy"] == "least-loaded"  # the variant as the default's entry
    assert doc["policies"][sweep.DEFAULT]["completed"] == 12
    assert "--reported out" in doc["commands"][sweep.DEFAULT]
    assert f"{len(cells)} rows" in text and len(list(out.glob("*.json"))) == len(cells) == 25
