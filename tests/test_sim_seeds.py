"""The summary over seeds (simulator/seeds.py) and its tables, on hand-made results whose means,
paired standard errors and win counts are worked out here by hand."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console
from tokenyard.simulator import report, seeds_report
from tokenyard.simulator.seeds import FIGURES, parse_seeds, summarise


def res(met: int, refused: int, ttft: float, goodput: float | None = None) -> dict:
    return {
        "outcomes": {"all": {"met_slo": met, "refused": refused, "expired": 0}},
        "mean_ttft_ms": ttft, "p99_ttft_ms": 2 * ttft, "p99_tpot_ms": 50.0,
        "request_throughput": met / 10, "request_goodput": goodput,
    }  # fmt: skip


def runs3() -> list[dict]:
    """base met 10, 20, 30; peer 12, 19, 35 → d = +2, −1, +5. refused d = −1, +1, 0."""
    return [
        {"seed": 101, "policies": {"base": res(10, 5, 100.0), "peer": res(12, 4, 90.0)}},
        {"seed": 102, "policies": {"base": res(20, 5, 100.0), "peer": res(19, 6, 130.0)}},
        {"seed": 103, "policies": {"base": res(30, 5, 100.0), "peer": res(35, 5, float("nan"))}},
    ]


def test_means_paired_standard_error_and_wins_by_hand():
    s = summarise(runs3())
    assert s["seeds"] == [101, 102, 103] and s["baseline"] == "base"
    assert s["mean"]["base"]["met_slo"] == 20.0 and s["mean"]["peer"]["met_slo"] == 22.0
    met = s["paired"]["peer"]["met_slo"]
    # d = 2, −1, 5: mean 2; deviations 0, −3, 3: sample variance 18 / 2 = 9, sd 3, se 3 / √3 = √3
    assert met["mean"] == 2.0 and met["se"] == pytest.approx(math.sqrt(3), rel=1e-12)
    assert (met["better"], met["worse"], met["n"]) == (2, 1, 3)
    refused = s["paired"]["peer"]["refused"]  # lower is better: −1 wins, +1 loses, 0 is neither
    assert refused["mean"] == 0.0 and (refused["better"], refused["worse"], refused["n"]) == (1, 1, 3)
    assert refused["se"] == pytest.approx(math.sqrt(1 / 3), rel=1e-12)  # var (1 + 1 + 0) / 2 = 1
    # a NaN mean TTFT (seed 103: nothing finite) drops that seed from the mean and the pairs
    assert s["mean"]["peer"]["mean_ttft_ms"] == 110.0
    ttft = s["paired"]["peer"]["mean_ttft_ms"]  # d = −10, +30
    assert ttft["mean"] == 10.0 and ttft["n"] == 2 and (ttft["better"], ttft["worse"]) == (1, 1)
    assert ttft["se"] == pytest.approx(20.0)  # sd √((20² + 20²) / 1) = 20√2, / √2
    assert "request_goodput" not in s["mean"]["base"]  # no --goodput, no goodput figure


def test_goodput_is_a_figure_when_asked_and_one_seed_has_no_standard_error():
    one = runs3()[:1]
    for run, (b, p) in zip(one, [(1.5, 2.0)], strict=True):
        run["policies"]["base"]["request_goodput"], run["policies"]["peer"]["request_goodput"] = b, p
    s = summarise(one, goodput=True)
    g = s["paired"]["peer"]["request_goodput"]
    assert (g["mean"], g["se"], g["better"], g["n"]) == (0.5, None, 1, 1)
    assert seeds_report.diff_cell(FIGURES[3], g) == ("+0.50 ± –", "1/1")


def test_runs_with_different_policies_are_refused():
    runs = runs3()
    runs[1]["policies"] = {"peer": runs[1]["policies"]["peer"], "base": runs[1]["policies"]["base"]}
    with pytest.raises(ValueError, match="seed 102 ran"):
        summarise(runs)


@pytest.mark.parametrize(
    "text, seeds",
    [("101-104", [101, 102, 103, 104]), ("1,2,5", [1, 2, 5]), ("1-3,7", [1, 2, 3, 7]), (" 9 ", [9]), ("0-0", [0])],
)
def test_seeds_parse(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    "text, message",
    [("", "neither"), ("3-1", "not a range"), ("-5", "neither"), ("1,1", "twice"), ("1-3,2", "twice"),
     ("a", "neither"), ("1-", "neither"), ("0-20000", "more than")],
)  # fmt: skip
def test_bad_seeds_are_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


def test_seeds_are_written_back_as_ranges():
    assert seeds_report.seeds_text([101, 102, 103, 7, 9, 10]) == "101-103,7,9-10"


def test_the_tables_show_the_pairs_and_fit_100_columns():
    """The widest case: long policy names, five peers, five-digit counts and latencies."""
    names = ("multiplicative", "multiplicative-unguarded", "llmd-token-load", "round-robin", "least-loaded", "llmd")
    runs = []
    for k, seed in enumerate((1, 2, 3)):
        pol = {n: res(12000 + 7 * i * k, 10000 - i * k, 123456.0 + 1000 * i * k, 12.34) for i, n in enumerate(names)}
        runs.append({"seed": seed, "policies": pol})
    console = Console(width=report.WIDTH, record=True, file=io.StringIO())
    seeds_report.print_summary(summarise(runs, goodput=True), "mooncake · 16 × a100-llama3-8b", True, console)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= report.WIDTH
    for name in names:
        assert name in text  # whole, on one line
    # llmd (i = 5): met d = 0, 35, 70 → +35.0 ± 20.2, better on 2 of 3
    assert "+35.0 ± 20.2" in text and "2/3" in text and "16 × a100-llama3-8b · 3 seeds (1-3)" in text
    assert "policy − multiplicative on the same seed, mean ± standard error over 3 seeds" in " ".join(text.split())
