"""bench/idle_cpu.py's arithmetic: CPU seconds sampled from /proc → ms per wall second by
process group, the edge's processes summed, and the fleet's total."""

from __future__ import annotations

from bench.idle_cpu import rates, table


def test_rates_sum_the_edge_processes_and_give_the_fleets_total():
    before = {"nats-server": 1.0, "edge-0": 0.5, "edge-1": 0.5, "queue": 2.0, "workers": 4.0}
    after = {"nats-server": 1.2, "edge-0": 0.51, "edge-1": 0.52, "queue": 2.5, "workers": 4.4}
    got = rates(before, after, 10.0)
    assert got == {"nats-server": 20.0, "edge": 3.0, "queue": 50.0, "workers": 40.0, "fleet": 113.0}


def test_the_table_has_a_row_per_sample_and_a_column_per_group():
    doc = {"runs": [{"round": 1, "fleet": "this tree", "load_avg": [1.0, 2.0],
                     "cpu_ms_per_s": {"queue": 23.25, "fleet": 23.25}},
                    {"round": 1, "fleet": "baseline", "load_avg": [1.0, 2.0],
                     "cpu_ms_per_s": {"queue": 33.0, "macro": 15.0, "fleet": 48.0}}]}
    lines = table(doc).splitlines()
    assert lines[0] == "| round | fleet | load average | queue | fleet | macro |"
    assert lines[2] == "| 1 | this tree | 1.0 → 2.0 | 23.2 | 23.2 | 0.0 |"
    assert lines[3] == "| 1 | baseline | 1.0 → 2.0 | 33.0 | 48.0 | 15.0 |"
