"""bench/routing_estimates.py (round 13): its `base` decides as the router's default, the decay
drains a heartbeat's queue at the prefill rate, `fly` records r's chain on its instance until
r's predicted first token, and the step terms add i's decodes to r's own TTFT."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from bench import routing_estimates as re_


def _sim(policy: str, n: int = 150):
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    w = open_workload("chatbot", num_requests=n, rate_scale=2.0)
    return simulate(w, SimConfig(instances=4, profile="a100-llama3-8b", policy=policy), {"ttft": 2000.0, "tpot": 100.0})


def test_base_decides_as_the_router_does_and_a_variant_does_not(monkeypatch):
    from tokenyard.services.router import core

    monkeypatch.setattr(core, "POLICIES", dict(core.POLICIES))  # the registrations end with the test
    monkeypatch.setattr(core.RouterCore, "route", core.RouterCore.route)
    keys = ("mean_ttft_ms", "p99_tpot_ms", "prefix_hit_ratio", "request_goodput", "duration")
    base, default = _sim(re_.register("base")), _sim(core.DEFAULT_POLICY)
    assert [base[k] for k in keys] == [default[k] for k in keys]


def test_decay_drains_the_heartbeats_queue_at_the_prefill_rate_and_no_further():
    # rows: 1,000 queued heard 10 ms ago at 0.05 ms/token → 200 ran; 100 queued → all ran;
    # no prefill cost measured → nothing assumed run
    stats = [SimpleNamespace(queued_prefill_tokens=q) for q in (1000, 100, 500)]
    view = SimpleNamespace(n=3, stats=stats, ms_per_token=np.array([0.05, 0.05, 0.0]),
                           seen_s=np.array([1.0, 1.0, 1.0]))
    assert re_._decayed(view, 1.010).tolist() == [200.0, 100.0, 0.0]


def test_fly_records_rs_chain_on_its_instance_until_its_predicted_first_token(monkeypatch):
    from tokenyard.services.router import core

    from tests.builders import hb, req

    monkeypatch.setattr(core, "POLICIES", dict(core.POLICIES))
    monkeypatch.setattr(core.RouterCore, "route", core.RouterCore.route)
    seen = []
    monkeypatch.setattr(core.BlockIndex, "predict", lambda self, w, chain, exp: seen.append((w, list(chain), exp)))
    rc = core.RouterCore(core.RouterConfig(policy=re_.register("fly")))
    rc.on_heartbeat(hb("w0", prefill_ms_per_token=0.05), 1.0)
    choice = rc.route(req("r", prompt_len=4000, chain=[11, 12, 13]), 1.0)
    assert choice.worker_id == "w0"
    # the chain on w0 until 2 × (Q + N) × t = 2 × 4,000 × 0.05 ms = 0.4 s after the decision
    assert seen[-1][:2] == ("w0", [11, 12, 13]) and abs(seen[-1][2] - 1.4) < 1e-9


def test_the_step_terms_add_is_decodes_to_rs_own_ttft():
    # two rows, nothing queued, decodes inside their slack (A = ∞): cost = N + N·B̄/2 (+ the step
    # term); row 0 runs 8 sequences holding 100 blocks of 16, row 1 none
    view = SimpleNamespace(queued_prefill=np.zeros(2), new=np.array([3000, 3000]), load=np.array([8, 0]),
                           running=np.array([8, 0]), absorb=np.full(2, np.inf), ms_per_token=np.array([0.05, 0.05]),
                           stats=[SimpleNamespace(decode_ms_per_ctx_token=0.0001)] * 2,
                           kv_used=np.array([100, 0]), block_size=np.array([16, 16]))
    cand = np.arange(2)
    base = 3000 + 3000 * 4 / 2
    # step1: + B + ρ·C = 8 + (0.0001 / 0.05) · 1,600 = 8 + 3.2 on row 0
    one = re_.StepScorer("1").score(None, view, cand).scores
    assert np.allclose(one, [base + 11.2, base])
    # stepk: ⌈3,000 / 2,048⌉ = 2 steps
    k = re_.StepScorer("k").score(None, view, cand).scores
    assert np.allclose(k, [base + 22.4, base])


def test_count_scores_the_tune_tables_as_the_sweep_does(tmp_path):
    # one cell: `v` wins TTFT (90 ≤ 0.9 × 100), TPOT (10 ≤ 10) and hit (0.49 ≥ 0.50 − 0.01), not goodput
    rows = {"base": (100, 12, 0.40, 5.0), "v": (90, 10, 0.49, 4.0), "dynamo": (100, 10, 0.50, 5.0),
            "llmd": (120, 11, 0.30, 4.5), "llmd-token-load": (130, 11, 0.30, 4.5), "sglang": (140, 11, 0.3, 4.5),
            "least-loaded": (150, 11, 0.3, 4.5)}
    table = tmp_path / "tune.md"
    table.write_text("| workload | load | variant | TTFT mean (ms) | TPOT p99 (ms) | hit | goodput (req/s) | failed |\n"
                     + "".join(f"| chatbot | ×1 | {k} | {a} | {b} | {c} | {d} | 0 |\n" for k, (a, b, c, d) in rows.items()))
    text = re_.count([str(table)])
    assert "| base | 0 | 0 | 0 | 1 | 1 |  |" in text
    assert "| v | 1 | 1 | 1 | 0 | 1 | -10.00%, -16.67%, +22.50%, -20.00% |" in text
