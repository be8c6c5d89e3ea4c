"""The comparison table and the results document's tables, on hand-made results."""

from __future__ import annotations

import io
import json

from rich.console import Console
from tokenyard.simulator import report

from bench import results_doc


def fake(policy: str, ttft: float, tpot: float, hit: float, goodput: float) -> dict:
    return {
        "policy": policy, "completed": 10, "failed": 0, "request_throughput": 1.0, "request_goodput": goodput,
        "output_throughput": 100.0, "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "p90_ttft_ms": ttft,
        "p99_ttft_ms": ttft, "mean_tpot_ms": tpot, "p99_tpot_ms": tpot, "p99_itl_ms": tpot, "mean_e2el_ms": 1.0,
        "prefix_hit_ratio": hit, "prefix_hit_bound": 0.5, "preemptions": 0, "sim_speed": 10.0,
        "load_balance": {"prefill_tokens_cv": 0.1, "batch_size_max_over_min": None},
    }  # fmt: skip


def test_table_shows_ratios_to_the_first_policy():
    console = Console(width=250, record=True, file=io.StringIO())
    report.print_results({"a": fake("a", 100, 10, 0.4, 2.0), "b": fake("b", 50, 20, 0.3, 1.0)}, console=console)
    text = console.export_text()
    assert "50 (0.50)" in text and "20.0 (2.00)" in text and "ratio to a" in text and "bound 0.500" in text


def test_tables_fit_100_columns_with_every_metric_and_whole_policy_names():
    """The widest case: the longest policy name, six-digit latencies, every ratio shown."""
    results = {}
    for name in ("multiplicative", "multiplicative-unguarded", "llmd-token-load", "round-robin"):
        r = fake(name, 123456.0, 1234.5, 0.123, 12.34)
        r.update(completed=12031, preemptions=123456, sim_speed=12345.0)
        r["load_balance"] = {"prefill_tokens_cv": 1.234, "batch_size_max_over_min": 123.45}
        results[name] = r
    console = Console(width=report.WIDTH, record=True, file=io.StringIO())
    report.print_results(results, "mooncake · 16 × a100-llama3-8b", console=console)
    lines = console.export_text().splitlines()
    assert report.WIDTH == 100 and max(len(line) for line in lines) <= 100
    assert sum("multiplicative-unguarded" in line for line in lines) == len(report.GROUPS)  # never cut
    assert not any(line.startswith("│ ") and line.split("│")[1].strip() == "" for line in lines)  # no wrapped cells
    shown = {h for _, headers in report.GROUPS for h in headers}
    assert shown == {h for h, _, _ in report.COLUMNS}


def test_results_doc_tables_and_losses(tmp_path):
    for load, b_ttft in ((1, 80.0), (2, 120.0)):
        doc = {
            "config": {"num_requests": 10, "instances": 2, "profile": "p", "seed": 0},
            "policies": {
                "multiplicative": fake("multiplicative", 100, 10, 0.4, 2.0),
                "llmd": fake("llmd", b_ttft, 12, 0.45, 2.0),
            },
            "command": f"tokenyard sim --rate-scale {load}",
        }
        (tmp_path / f"chatbot_x{load}.json").write_text(json.dumps(doc))
    out = results_doc.render(tmp_path)
    assert "| ×1 | **multiplicative** | 100 | 10.0 | 0.400 | 100 | 100 | 100 | 2.00 | 0 |" in out
    assert "tokenyard sim --rate-scale 2" in out
    assert "* ×1, mean TTFT: multiplicative 100 ms; better: llmd 80 ms" in out
    assert "* ×2, KV$ hit ratio: multiplicative 0.400; better: llmd 0.450" in out
    assert "×2, mean TTFT" not in out
