"""`tokenyard tune`: the objective's measures and score, the optuna search on a formula, the
heavy-tailed workload, and one small run over the simulator."""

from __future__ import annotations

import math

import pytest
from tokenyard.loadgen.workloads.heavy_tail import BUCKETS, HeavyTailWorkload
from tokenyard.tuning.evaluate import KNOB_DEFAULTS, SimSetup, policy_knobs
from tokenyard.tuning.objective import Classes, Measures, Weights, measure, score
from tokenyard.tuning.search import SPACE, tune


def test_measure_splits_short_and_long_by_length():
    rows = [(100, 0.2), (300, 0.4), (400, None), (9000, 30.0), (10_000, 90.0), (20_000, None), (1000, 5.0)]
    m = measure(rows, duration_s=2.0, classes=Classes(short_tokens=512, long_tokens=8192, long_ttft_s=60.0))
    assert m == Measures(throughput=2.5, long_done=1 / 3, short_p50_ttft_s=pytest.approx(0.3),
                         long_p99_ttft_s=pytest.approx(89.4), completed=5, failed=2,
                         long_p50_ttft_s=pytest.approx(60.0), long_mean_ttft_s=pytest.approx(60.0),
                         short_failed=1, long_failed=1)


def test_measure_with_no_short_or_long_requests():
    m = measure([(1000, 1.0)], 1.0)
    assert (m.long_done, m.short_p50_ttft_s, m.long_p99_ttft_s) == (1.0, 0.0, 0.0)


def test_score_normalises_by_the_default_run():
    base = Measures(10.0, 0.5, 2.0, 50.0, 100, 0)
    better = Measures(11.0, 0.9, 1.0, 30.0, 110, 0)
    assert score(base, base) == pytest.approx(0.5)
    assert score(better, base) == pytest.approx(1.1 + 0.9 - 0.5)
    assert score(better, base, Weights(alpha=2.0, beta=0.0, gamma=3.0)) == pytest.approx(2.2 - 1.5)


def formula(params: dict[str, float]) -> Measures:
    """A made-up response surface: long requests do best at a 256-token bubble width."""
    off = abs(math.log2(params["bubble_width"] / 256.0))
    return Measures(10.0, max(0.0, 1.0 - off / 10.0), 1.0 + params["aging_p3_s"] / 100.0, 0.0, 100, 0)


def test_tune_beats_the_defaults_on_a_known_surface_and_is_deterministic():
    a = tune(formula, trials=25, seed=7)
    b = tune(formula, trials=25, seed=7)
    assert a.best_params == b.best_params and a.best_score == b.best_score
    assert a.default_score == pytest.approx(1.0 + 0.8 - 1.0)  # width 1024 is 2 octaves off
    assert a.gain > 0.1
    assert abs(math.log2(a.best_params["bubble_width"] / 256.0)) < 1.0
    assert len(a.trials) == 26  # the defaults, then 25 proposals
    assert a.trials[0] == ({k: KNOB_DEFAULTS[k] for k in SPACE}, a.default_score)
    for params, _ in a.trials:
        assert all(SPACE[k][0] <= v <= SPACE[k][1] for k, v in params.items())


def test_policy_knobs_become_make_policy_keywords():
    assert policy_knobs({"bubble_width": 300.0, "aging_p3_s": 2.0}) == {
        "bubble_width": 300.0, "aging_s": (math.inf, 30.0, 15.0, 2.0)}


def test_heavy_tail_workload_shares_and_determinism():
    w = HeavyTailWorkload(4000, rate=10.0, seed=3)
    items = w.items()
    assert items == HeavyTailWorkload(4000, rate=10.0, seed=3).items()
    shares = [sum(lo <= r.prompt_len < hi for r in items) / len(items) for lo, hi in BUCKETS]
    assert shares == pytest.approx([0.45, 0.30, 0.15, 0.10], abs=0.02)
    assert all(8 <= r.max_tokens <= 1024 for r in items)
    assert all(len(r.block_ids) == -(-r.prompt_len // 16) for r in items)
    assert items[0].arrival_s == 0.0 and items[-1].arrival_s == pytest.approx(400.0, rel=0.1)


def test_a_small_tuning_run_over_the_simulator():
    from tokenyard.simulator.cluster import SimConfig

    setup = SimSetup(HeavyTailWorkload(60, rate=20.0, seed=1), SimConfig(instances=1, slots_per_worker=1))
    res = tune(setup.run, trials=2, seed=0)
    assert res.default.completed == 60 and res.default.failed == 0
    assert len(res.trials) == 3
    assert res.best_score >= res.default_score


def test_the_result_file_records_the_command(tmp_path, monkeypatch):
    import json
    import sys

    from tokenyard.cli import main

    out = tmp_path / "tune.json"
    argv = ["tune", "--workload", "heavy-tail", "--rate", "20", "--num-requests", "40", "--instances", "1",
            "--trials", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", ["tokenyard", *argv])
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == "tokenyard " + " ".join(argv)
    assert (doc["workload"], doc["trials"], len(doc["history"])) == ("heavy-tail", 1, 2)


def test_tune_refuses_a_slot_count_that_flow_control_would_ignore(capsys):
    """With flow control on (the default) the queue releases by the workers' prefill room: a
    slot count would be silently ignored, so asking for one is an error that says how."""
    from tokenyard.cli import main

    assert main(["tune", "--workload", "chatbot", "--trials", "1", "--num-requests", "20",
                 "--slots-per-worker", "2"]) == 2
    assert "--slots-per-worker acts only with --flow-control off" in capsys.readouterr().err


def test_with_flow_control_off_the_slot_count_shapes_the_run():
    """`--flow-control off --slots-per-worker N` is what the knob means: it changes where the
    backlog waits, and so the short requests' TTFT."""
    from tokenyard.simulator.cluster import SimConfig

    def run(slots: int):
        cfg = SimConfig(instances=1, flow_control=False, slots_per_worker=slots)
        return SimSetup(HeavyTailWorkload(80, rate=40.0, seed=2), cfg).run({})

    one, many = run(1), run(64)
    assert one.completed == many.completed == 80
    assert one.short_p50_ttft_s != many.short_p50_ttft_s


def test_refusals_turn_on_what_a_user_gets_and_count_the_refused_by_length():
    """The study runs with admission's SLO refusals and the queue's deadline rejection off (no
    request lost); `refusals=True` keeps the fleet's defaults, and the refused are counted."""
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.tuning.evaluate import PartitionedSetup

    w = HeavyTailWorkload(300, rate=30.0, seed=1)
    shared = [SimSetup(w, SimConfig(instances=2), "bubble", refusals=r).run({}) for r in (False, True)]
    assert [(m.completed, m.failed, m.short_failed, m.long_failed) for m in shared] == [(300, 0, 0, 0), (203, 97, 31, 28)]
    split = [PartitionedSetup(w, SimConfig(instances=4), counts=(1, 1, 1, 1), refusals=r).run() for r in (False, True)]
    assert [(m.completed, m.failed, m.short_failed, m.long_failed) for m in split] == [(300, 0, 0, 0), (268, 32, 0, 23)]
