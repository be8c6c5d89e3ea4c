"""bench/live_router.py's pure parts: the fleet metrics it keeps from each service's
Prometheus page, and its table (rounds, load averages, skipped runs)."""

from __future__ import annotations

from bench.live_router import fleet_series, table

QUEUE_PAGE = """# HELP tokenyard:queue_wait_seconds Arrival to routed, by priority class.
# TYPE tokenyard:queue_wait_seconds histogram
tokenyard:queue_wait_seconds_bucket{le="0.1",priority="P1"} 62.0
tokenyard:queue_wait_seconds_count{priority="P1"} 75.0
tokenyard:queue_wait_seconds_sum{priority="P1"} 5.137285470962524
tokenyard:queue_dispatches_total{outcome="routed"} 75.0
tokenyard:queue_dispatches_created{outcome="routed"} 1.7961543358833652e+09
"""
ROUTER_PAGE = """tokenyard:router_decisions_total{outcome="routed",policy="marginal-latency"} 75.0
tokenyard:router_decision_seconds_count 75.0
tokenyard:router_decision_seconds_sum 2.5
"""


def test_the_fleet_series_are_kept_and_summed_over_pages():
    out = fleet_series(ROUTER_PAGE, fleet_series(QUEUE_PAGE, {}))
    assert out == {
        'tokenyard:queue_wait_seconds_count{priority="P1"}': 75.0,
        'tokenyard:queue_wait_seconds_sum{priority="P1"}': 5.137285470962524,
        'tokenyard:queue_dispatches_total{outcome="routed"}': 75.0,
        'tokenyard:router_decisions_total{outcome="routed",policy="marginal-latency"}': 75.0,
        "tokenyard:router_decision_seconds_count": 75.0,
        "tokenyard:router_decision_seconds_sum": 2.5,
    }  # buckets and `_created` are left out
    assert fleet_series(ROUTER_PAGE, out)["tokenyard:router_decision_seconds_sum"] == 5.0  # a second router


def test_the_table_shows_each_round_its_load_average_and_a_skipped_run():
    doc = {"runs": [
        {"round": 2, "router": "tokenyard", "load": 3.0, "rate": 4.5, "load_avg": [15.8, 16.7], "completed": 150,
         "failed": 0, "median_ttft_ms": 110.43, "p99_ttft_ms": 297.04, "mean_ttft_ms": 126.39, "p99_tpot_ms": 19.46,
         "request_throughput": 0.996},
        {"round": 2, "router": "vllm", "load": 3.0, "rate": 4.5, "error": "vllm-router is not installed"},
    ]}
    lines = table(doc).splitlines()
    assert lines[2] == "| 2 | ×3 | tokenyard | 15.8 → 16.7 | 150 | 0 | 110.4 | 297.0 | 126.4 | 19.5 | 1.00 |"
    assert lines[3].startswith("| 2 | ×3 | vllm | | — | — | skipped: vllm-router is not installed")
    assert all(line.count("|") == lines[0].count("|") for line in lines)  # every row has every column
