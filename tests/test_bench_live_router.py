"""bench/live_router.py's pure parts: the fleet metrics it keeps from each service's
Prometheus page, its tables (rounds, load averages, skipped runs; where the time and CPU
went), and the CPU it reads per process group."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.live_router import (
    breakdown,
    cpu_s,
    engine_ttft,
    fleet_series,
    sim_twin,
    table,
)
from bench.route_log import choice_summary, placements, route_choices, route_table

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


def test_the_breakdown_shows_engine_time_hits_spread_and_cpu_per_request():
    ours = {"round": 1, "router": "tokenyard", "load": 1.0, "mean_ttft_ms": 50.0,
            "cpu_ms_per_request": {"nats-server": 20.0, "edge-0": 10.0, "edge-1": 8.5, "queue": 30.0, "client": 21.0},
            "idle_cpu_ms_per_s": {"nats-server": 14.0, "edge-0": 0.25, "edge-1": 0.5, "queue": 23.0},
            "fleet_metrics": {
                'vllm:time_to_first_token_seconds_sum{model_name="m",worker_id="w0"}': 30.0,
                'vllm:time_to_first_token_seconds_count{model_name="m",worker_id="w0"}': 200.0,
                'vllm:time_to_first_token_seconds_sum{model_name="m",worker_id="w1"}': 10.0,
                'vllm:time_to_first_token_seconds_count{model_name="m",worker_id="w1"}': 100.0,
                'vllm:prefix_cache_hits_total{model_name="m",worker_id="w0"}': 300.0,
                'vllm:prefix_cache_queries_total{model_name="m",worker_id="w0"}': 1000.0}}
    peer = {"round": 1, "router": "sglang", "load": 1.0, "mean_ttft_ms": 40.0,
            "cpu_ms_per_request": {"router": 17.0, "workers": 48.0, "client": 22.0},
            "worker_metrics": {"w0": {'vllm:request_success_total{model_name="m",finished_reason="length"}': 180.0},
                               "w1": {'vllm:request_success_total{model_name="m",finished_reason="length"}': 120.0}},
            "fleet_metrics": {}}
    assert engine_ttft(ours["fleet_metrics"]) == (40.0 / 300, [100, 200])
    lines = breakdown({"config": {"speed": 0.25}, "runs": [ours, peer, {"router": "vllm", "load": 1.0, "error": "x"}]})
    rows = lines.splitlines()
    # engine mean 40/300 s = 133.3 wall ms = 33.3 simulated; the edge's two processes summed
    assert rows[2] == ("| 1 | ×1 | tokenyard | 50.0 | 33.3 | 16.7 | 0.300 | 100 / 200 | nats-server 20.0, edge 18.5, "
                       "queue 30.0, client 21.0 (fleet 68.5) | nats-server 14.0, edge 0.8, queue 23.0 (fleet 37.8) |")
    assert rows[3] == ("| 1 | ×1 | sglang | 40.0 | – | – | – | 120 / 180 | router 17.0, workers 48.0, client 22.0 "
                       "(fleet 65.0) | – |")  # a run without an idle sample
    assert len(rows) == 4  # a skipped run has no breakdown


def test_cpu_seconds_are_read_per_group_and_this_process_is_the_client():
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        busy = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
        try:
            first = cpu_s([("worker-0", me), ("worker-1", busy)])
            deadline = time.monotonic() + 30.0
            while (second := cpu_s([("worker-0", me), ("worker-1", busy)]))["workers"] <= first["workers"]:
                assert time.monotonic() < deadline, "a busy process spent no CPU in 30 s"
                time.sleep(0.01)  # a clock tick is 10 ms: read again until one has passed
        finally:
            busy.kill()
            busy.wait()
    finally:
        me.kill()
        me.wait()
    assert set(first) == {"workers", "client"}  # both workers in one group
    assert second["client"] >= first["client"] > 0.0
    gone = cpu_s([("router", me)])  # a process that has exited (and been reaped) is left out
    assert set(gone) == {"client"}


def _choice(rid, worker, plen, hit, load=(3, 5), queued=(0.0, 100.0), notes=()):
    return {"event": "route_choice", "request_id": rid, "worker": worker, "prompt_tokens": plen,
            "notes": list(notes), "workers": ["w0", "w1"], "hit": list(hit), "load": list(load), "queued": list(queued)}


def test_route_choices_are_read_from_the_queue_log_after_the_runs_start(tmp_path):
    log = tmp_path / "queue.log"
    log.write_text(json.dumps(_choice("old", "w0", 10, (0, 0))) + "\n")
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write('{"event": "worker_forgotten", "worker": "w9"}\n')
        f.write(json.dumps(_choice("a", "w1", 100, (64, 0))) + "\n")
        f.write("not json at all, but \"route_choice\" in it\n")
    assert [c["request_id"] for c in route_choices(log, start)] == ["a"]
    assert route_choices(tmp_path / "absent.log", 0) == []


def test_the_summary_counts_each_requests_last_offer_and_lists_what_the_policy_gave_up():
    choices = [
        _choice("a", "w0", 100, (96, 0)),           # on its holder
        _choice("b", "w0", 200, (64, 160)),         # refused by w0 …
        _choice("b", "w1", 200, (64, 160)),         # … and taken by the holder
        _choice("c", "w1", 300, (288, 32), notes=("sticky",)),  # away from its holder: 256 tokens given up
    ]
    s = choice_summary(choices)
    assert (s["offers"], s["chosen_hit"], s["best_hit"]) == (4, 96 + 160 + 32, 96 + 160 + 288)
    assert [(a["request_id"], a["lost"], a["notes"]) for a in s["away"]] == [("c", 256, ["sticky"])]


def test_placements_pair_the_log_with_the_benchs_requests_by_prompt_length_in_order():
    requests = [{"index": 0, "prompt_len": 100}, {"index": 1, "prompt_len": 200}, {"index": 2, "prompt_len": 100}]
    choices = [_choice("x", "w1", 100, (0, 96), load=(2, 7), queued=(0.0, 4.0)),
               _choice("y", "w0", 200, (0, 0)), _choice("y", "w1", 200, (0, 0)),
               _choice("z", "w0", 100, (96, 0)), _choice("q", "w0", 999, (0, 0))]  # q: not the bench's
    placements(choices, requests)
    assert requests[0] | {} == {"index": 0, "prompt_len": 100, "worker": "w1", "hit": 96, "best_hit": 96, "load": 7,
                                "queued": 4.0, "notes": [], "offers": 1}
    assert (requests[1]["worker"], requests[1]["offers"], requests[1]["refused_by"]) == ("w1", 2, ["w0"])
    assert "refused_by" not in requests[0]
    assert (requests[2]["worker"], requests[2]["hit"]) == ("w0", 96)


def test_the_route_table_puts_the_three_hit_shares_side_by_side():
    run = {"round": 1, "router": "tokenyard", "load": 1.0,
           "route_choices": {"offers": 3, "chosen_hit": 600, "best_hit": 700, "away": [{"lost": 100}]},
           "fleet_metrics": {'vllm:prefix_cache_hits_total{worker_id="w0"}': 590.0,
                             'vllm:prefix_cache_queries_total{worker_id="w0"}': 1000.0}}
    rows = route_table({"runs": [run, {"router": "sglang", "load": 1.0, "fleet_metrics": {}}]}).splitlines()
    assert rows[2] == "| 1 | ×1 | tokenyard | 3 | 0.600 | 0.700 | 0.590 | 1 |"
    assert len(rows) == 3  # a run without the log has no row


def test_the_sim_twin_replays_the_live_runs_requests_at_their_simulated_times():
    from tokenyard.loadgen.config import BenchConfig
    from tokenyard.loadgen.workload import make_workload
    from tokenyard.loadgen.workloads import open_workload

    cmd = sim_twin("chatbot", 60.0, 3.0, 0.25, 4, 300, 0)
    assert cmd == ("tokenyard sim --workload chatbot --instances 4 --profile a100-llama3-8b --rate 11.25 "
                   "--rate-scale 4 --heartbeat-s 0.025 --num-requests 300 --seed 0 --compare marginal-latency,sglang")
    live = list(make_workload(BenchConfig(workload="chatbot", num_prompts=300, rate=11.25, seed=0)).requests())
    twin = open_workload("chatbot", num_requests=300, rate=11.25, rate_scale=4.0, seed=0).items()
    assert [r.prompt_len for r in live] == [t.prompt_len for t in twin]  # the same requests …
    assert all(abs(r.arrival_s / 4.0 - t.arrival_s) < 1e-9 for r, t in zip(live, twin, strict=True))  # … 4× sooner
    rescaled = open_workload("chatbot", num_requests=300, rate_scale=0.25, seed=0).items()  # round 7's
    assert sum(t.prompt_len for t in twin) == 261_977 != sum(t.prompt_len for t in rescaled)  # other conversations


def test_engine_placements_pair_the_workers_lines_with_the_benchs_requests_in_arrival_order(tmp_path):
    from bench.route_log import engine_placements, served_lines

    def line(prompt, cached, arrived, ttft, queued=(0, 0)):
        return json.dumps({"event": "first_token", "prompt_tokens": prompt, "cached_tokens": cached,
                           "arrived_s": arrived, "ttft_ms": ttft, "running": 3, "waiting": 1,
                           "queued_prefill": queued[0], "queued_prefill_net": queued[1]}) + "\n"

    w0, w1 = tmp_path / "w0.log", tmp_path / "w1.log"
    w0.write_text('{"event": "started"}\n' + line(100, 0, 10.0, 30.0, (500, 120)) + line(100, 96, 12.0, 8.0))
    w1.write_text(line(200, 160, 11.0, 20.0))
    served = served_lines(w0, 0, "w0") + served_lines(w1, 0, "w1") + served_lines(tmp_path / "none.log", 0, "w2")
    requests = [{"index": 0, "prompt_len": 100}, {"index": 1, "prompt_len": 200}, {"index": 2, "prompt_len": 100},
                {"index": 3, "prompt_len": 300}]
    engine_placements(served, requests, peer=True)
    assert [(r.get("worker"), r.get("hit"), r.get("engine_ttft_ms")) for r in requests] == [
        ("w0", 0, 30.0), ("w1", 160, 20.0), ("w0", 96, 8.0), (None, None, None)]  # #3: no line (not served)
    assert (requests[0]["engine_queued"], requests[0]["engine_running"], requests[0]["engine_waiting"]) == ([500, 120], 3, 1)
    ours = [{"index": 0, "prompt_len": 100, "worker": "w1", "hit": 64}]  # behind tokenyard: the route log's stay
    engine_placements(served_lines(w0, 0, "w0"), ours, peer=False)
    assert (ours[0]["worker"], ours[0]["hit"], ours[0]["engine_worker"], ours[0]["engine_hit"]) == ("w1", 64, "w0", 0)
