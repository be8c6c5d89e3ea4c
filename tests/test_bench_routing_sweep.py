"""bench/routing_sweep.py: the default joins the peers' JSON of a point without rerunning them
(same request count only), and the won/lost verdicts against each metric's best peer."""

from __future__ import annotations

import json

import pytest

from bench import routing_sweep as sweep


def test_the_default_joins_the_peers_json_of_the_same_point(tmp_path):
    peers = ("least-loaded", "round-robin")
    _, _, _, rc = sweep.run_point("api", 1.0, tmp_path, "", requests=40, policies=peers)
    assert rc == 0
    first = json.loads((tmp_path / "api_x1.json").read_text())
    _, _, _, rc = sweep.run_point("api", 1.0, tmp_path, "", requests=40, policies=(sweep.DEFAULT,))
    assert rc == 0
    doc = json.loads((tmp_path / "api_x1.json").read_text())
    assert list(doc["policies"]) == [*peers, sweep.DEFAULT]
    assert doc["policies"]["least-loaded"] == first["policies"]["least-loaded"]  # not rerun
    assert "--compare least-loaded,round-robin" in doc["commands"]["round-robin"]
    assert f"--compare {sweep.DEFAULT} " in doc["commands"][sweep.DEFAULT]
    assert "--num-requests 40" in doc["commands"][sweep.DEFAULT]
    with pytest.raises(SystemExit, match="another request count"):
        sweep.run_point("api", 1.0, tmp_path, "", requests=30, policies=(sweep.DEFAULT,))


def test_a_trace_points_json_names_no_path_of_this_machine(tmp_path):
    traces = str(sweep.TRACES)
    _, _, _, rc = sweep.run_point("mooncake-report", 1.0, tmp_path, traces, requests=20, policies=("round-robin",))
    assert rc == 0
    text = (tmp_path / "mooncake-report_x1.json").read_text()
    assert traces not in text and str(sweep.ROOT) not in text
    assert json.loads(text)["command"].startswith("tokenyard sim --workload trace:TRACES/")


def metrics(ttft, tpot, hit, goodput, failed=0):
    return {"mean_ttft_ms": ttft, "p99_tpot_ms": tpot, "prefix_hit_ratio": hit, "request_goodput": goodput,
            "failed": failed}


def test_tables_mark_each_metric_against_its_own_best_peer(tmp_path):
    res = {
        sweep.DEFAULT: metrics(89.0, 20.0, 0.905, 10.0, failed=3),
        "dynamo": metrics(100.0, 19.0, 0.90, 9.0),
        "llmd": metrics(120.0, 25.0, 0.915, 11.0, failed=1),
    }
    (tmp_path / "api_x1.json").write_text(json.dumps({"policies": res}))
    (tmp_path / "api_x3.json").write_text(json.dumps({"policies": {"dynamo": res["dynamo"]}}))
    rows = [line for line in sweep.tables(tmp_path).splitlines() if line.startswith("| api |")]
    assert rows[1] == ("| api | ×1 | **won** 89 vs 100 (dynamo) | lost 20.0 vs 19.0 (dynamo) | **won** 0.905 vs "
                       "0.915 (llmd) | lost 10.00 vs 11.00 (llmd) | 3 vs 0 (dynamo) | lost |")
    assert "default not run" in rows[4] and "not run" in rows[0]


def outcome(met, refused, expired=0):
    return {"all": {"met_slo": met, "refused": refused, "expired": expired}}


def test_goodput_detail_tells_lost_requests_from_a_later_last_completion(tmp_path):
    """Goodput = requests within the SLO ÷ the run's span: a default that serves as many (or
    more) requests as the best peer but finishes its last one later loses goodput on time
    alone; the detail shows which. Cells the default wins are left out."""
    def point(met, refused, duration, goodput):
        return metrics(50.0, 20.0, 0.9, goodput) | {"outcomes": outcome(met, refused), "duration": duration}

    (tmp_path / "api_x1.json").write_text(json.dumps({"policies": {
        sweep.DEFAULT: point(970, 29, 142.33, 970 / 142.33),
        "llmd": point(965, 30, 129.55, 965 / 129.55),
        "dynamo": point(900, 90, 130.0, 900 / 130.0),
    }}))
    (tmp_path / "api_x2.json").write_text(json.dumps({"policies": {  # won: left out
        sweep.DEFAULT: point(1000, 0, 10.0, 100.0), "llmd": point(1000, 0, 10.5, 1000 / 10.5),
    }}))
    rows = [line for line in sweep.goodput_detail(tmp_path).splitlines() if line.startswith("| api |")]
    assert rows == ["| api | ×1 | llmd | 970 vs 965 | 29 vs 30 | 142.33 vs 129.55 | 6.815 vs 7.449 |"]


def test_goodput_under_both_definitions_says_where_the_definition_decides(tmp_path):
    """The figure's goodput (met ÷ span, vLLM's) against SLO attainment (met ÷ sent,
    DistServe's per-rate quantity): a default that serves more within the SLO but ends later
    loses the one and wins the other; one that fails more but ends sooner the reverse."""
    def point(met, refused, duration):
        return metrics(50.0, 20.0, 0.9, met / duration) | {
            "outcomes": {"all": {"met_slo": met, "refused": refused, "expired": 0, "missed_slo": 1000 - met - refused,
                                 "failed_other": 0}},
            "duration": duration}

    (tmp_path / "api_x1.json").write_text(json.dumps({"policies": {
        sweep.DEFAULT: point(970, 29, 142.33), "llmd": point(965, 34, 129.55)}}))
    (tmp_path / "api_x3.json").write_text(json.dumps({"policies": {
        sweep.DEFAULT: point(939, 61, 100.0), "llmd": point(949, 51, 110.0)}}))
    text = sweep.goodput_definitions(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| api |")]
    assert rows == ["| api | ×1 | 6.815 vs 7.449 (llmd) | lost | 0.970 vs 0.965 (llmd) | **won** |",
                    "| api | ×3 | 9.390 vs 8.627 (llmd) | **won** | 0.939 vs 0.949 (llmd) | lost |"]
    assert text.endswith("won: 1 of 2 by requests ÷ span (the figure's), 1 by SLO attainment; "
                         "the definition decides 2 cells")


def test_versus_counts_each_metrics_wins_before_and_after(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    for d, mine in ((before, metrics(95.0, 30.0, 0.90, 10.0)), (after, metrics(80.0, 18.0, 0.85, 10.0))):
        d.mkdir()
        (d / "api_x1.json").write_text(json.dumps({"policies": {
            sweep.DEFAULT: mine, "dynamo": metrics(100.0, 20.0, 0.90, 10.0)}}))
    text = sweep.versus(after, before)
    assert "| TTFT mean (ms) | 0 | 1 | -15.79% |" in text  # 95 → 80 ms against 0.9 × 100
    assert "| TPOT p99 (ms) | 0 | 1 | -40.00% |" in text
    assert "| hit | 1 | 0 | -5.56% (worse) |" in text
    assert "| goodput (req/s) | 1 | 1 | +0.00% |" in text
    assert "* hit: api ×1 won → lost (0.900 → 0.850 against dynamo's 0.900)" in text


def test_the_ttft_floor_is_below_every_policys_mean_ttft():
    """bench/routing_floor.py's floor (each request alone, with the infinite cache) bounds the
    simulator's mean TTFT from below, whatever the placement, where every request completes."""
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    from bench.routing_floor import ttft_floor_ms

    floor, refused = ttft_floor_ms("api", 120, 0)
    assert refused == 0
    w = open_workload("api", num_requests=120, rate_scale=1.0)
    for policy in (sweep.DEFAULT, "least-loaded", "round-robin"):
        r = simulate(w, SimConfig(instances=4, profile="a100-llama3-8b", policy=policy), {"ttft": 2000.0})
        assert r["failed"] == 0
        assert 0.0 < floor <= r["mean_ttft_ms"], policy


def test_the_ttft_floor_leaves_out_the_prompts_the_class_cap_refuses():
    """Round 13: the floor counts only the prompts admission admits (the class cap refuses the
    others for every policy alike), and the cap is admission's own longest P1 prompt."""
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.services.worker.sim.slack import prefill_ms_per_token
    from tokenyard.shared.slo import fits_class

    from bench.routing_floor import class_cap, ttft_floor_ms

    lens = sorted(r.prompt_len for r in open_workload("api", num_requests=120, rate_scale=1.0).items())
    longest = lens[60]
    whole, none = ttft_floor_ms("api", 120, 0)
    cut, refused = ttft_floor_ms("api", 120, 0, longest=longest)
    assert none == 0 and refused == sum(n > longest for n in lens) > 0
    assert 0.0 < cut < whole  # the longer half left out: a lower mean floor
    cap, p = class_cap(), profile("a100-llama3-8b")
    a, b = prefill_ms_per_token(p), p.p3 / 2
    assert fits_class((cap * a + cap * cap * b) / 1000.0, 1)
    assert not fits_class(((cap + 1) * a + (cap + 1) ** 2 * b) / 1000.0, 1)


def test_goodput_miss_splits_the_figures_goodput_by_the_slo_each_request_missed(tmp_path):
    """--goodput-miss reruns a lost cell's default and best peer: its `good` ÷ span is the
    figure's goodput of the same run (request_goodput), and every request sent is counted once."""
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.simulator.run import simulate

    def lost(goodput):
        return metrics(50.0, 20.0, 0.9, goodput)

    (tmp_path / "api_x3.json").write_text(json.dumps({"config": {"num_requests": 60}, "policies": {
        sweep.DEFAULT: lost(1.0), "least-loaded": lost(2.0)}}))
    rows = [line.split(" | ") for line in sweep.goodput_miss(tmp_path, "", {3.0}).splitlines()[2:]]
    assert [r[2] for r in rows] == [sweep.DEFAULT, "least-loaded"]
    w = open_workload("api", num_requests=60, rate_scale=3.0, seed=0)
    for r in rows:
        good, counts, span = int(r[3]), [int(x) for x in r[3:8]], float(r[8].rstrip(" |"))
        assert sum(counts) == 60
        res = simulate(w, SimConfig(instances=16, profile="a100-llama3-8b", policy=r[2], seed=0),
                       {"ttft": 2000.0, "tpot": 100.0})
        assert span == round(res["duration"], 2)
        assert good == round(res["request_goodput"] * res["duration"])
