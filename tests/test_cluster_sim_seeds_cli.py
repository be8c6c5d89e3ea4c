"""`tokenyard sim --compare A,B --seeds …` end to end: each seed's runs are `--seed s`'s, the
summary is computed from them (paired by seed), the same with --jobs 2, bad input refused."""

from __future__ import annotations

import json
import math

import pytest

from tokenyard.cli import main

BASE = ["sim", "--workload", "api", "--num-requests", "40", "--instances", "2", "--rate", "20",
        "--compare", "round-robin,marginal-latency", "--goodput", "ttft:300", "tpot:50"]  # fmt: skip
WALL = ("wall_s", "sim_speed")


def without_wall(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in WALL}


def test_seeds_run_each_seeds_comparison_and_pair_them(tmp_path, capsys):
    out = tmp_path / "seeds.json"
    assert main([*BASE, "--seeds", "3-4,9", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["seed"] for r in doc["runs"]] == [3, 4, 9]
    assert doc["config"]["seeds"] == [3, 4, 9] and doc["config"]["seed"] is None
    for run in doc["runs"]:  # each seed's comparison is the one --seed s prints
        single = tmp_path / f"{run['seed']}.json"
        assert main([*BASE, "--seed", str(run["seed"]), "--quiet", "--json", str(single)]) == 0
        one = json.loads(single.read_text())["policies"]
        assert list(run["policies"]) == ["round-robin", "marginal-latency"]
        assert {p: without_wall(r) for p, r in run["policies"].items()} == {p: without_wall(r) for p, r in one.items()}
    s = doc["summary"]
    assert s["baseline"] == "round-robin" and list(s["paired"]) == ["marginal-latency"]
    ttft = {p: [r["policies"][p]["mean_ttft_ms"] for r in doc["runs"]] for p in ("round-robin", "marginal-latency")}
    assert len(set(ttft["round-robin"])) == 3  # the seeds draw different workloads
    d = [m - b for m, b in zip(ttft["marginal-latency"], ttft["round-robin"], strict=True)]
    mean = sum(d) / 3
    pair = s["paired"]["marginal-latency"]["mean_ttft_ms"]
    assert pair["mean"] == pytest.approx(mean, rel=1e-12)
    assert pair["se"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in d) / 2 / 3), rel=1e-12)
    assert pair["better"] == sum(x < 0 for x in d) and pair["n"] == 3
    assert s["mean"]["round-robin"]["mean_ttft_ms"] == pytest.approx(sum(ttft["round-robin"]) / 3, rel=1e-12)
    assert "request_goodput" in s["mean"]["round-robin"]  # --goodput given
    text = " ".join(capsys.readouterr().out.split())
    assert "3 seeds (3-4,9)" in text and "paired difference to round-robin" in text
    assert f"{pair['better']}/3" in text


def test_jobs_give_the_same_summary(tmp_path):
    docs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}.json"
        assert main([*BASE, "--seeds", "5,6", "--jobs", jobs, "--quiet", "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    assert docs[0]["summary"] == docs[1]["summary"]
    assert [r["seed"] for r in docs[1]["runs"]] == [5, 6]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "4-2"], "not a range"),
        (["--seeds", "1,1"], "twice"),
        (["--seeds", "1-2", "--jobs", "0"], "--jobs"),
        (["--seeds", "1-2", "--plots", "p"], "--plots"),
        (["--seeds", "1-2", "--policy", "nope"], "unknown policy"),
    ],
)
def test_bad_seed_options_exit_2_with_a_message(args, message, capsys, tmp_path):
    argv = ["sim", "--workload", "api", "--num-requests", "5", "--json", str(tmp_path / "x.json"), *args]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_seed_and_seeds_are_exclusive(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sim", "--workload", "api", "--seed", "1", "--seeds", "1-2"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
