"""Every benchmark README.md names answers `--help` with its usage: no traceback, no run
started (bench/edge_profile.py read `--help` as its stream count and died; run_ecoserve.sh
took it for its output folder and started its first run); and every flag README shows after a
`tokenyard SUBCOMMAND` or a bench is one that command takes."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import ROOT


def readme_benches() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    modules = sorted(set(re.findall(r"python -m (bench\.[a-z_]+)", text)))
    scripts = sorted(set(re.findall(r"\b(bench/[a-z_]+\.(?:py|sh))\b", text)))
    commands = [[sys.executable, "-m", m] for m in modules]
    commands += [["bash", s] if s.endswith(".sh") else [sys.executable, s] for s in scripts]
    return commands


COMMAND = re.compile(r"tokenyard ((?:bench )?[a-z|]+)|python -m (bench\.[a-z_]+)|(bench/[a-z_]+\.py)")


def readme_flags() -> dict[str, set[str]]:
    """Each command README shows ('tokenyard up', 'bench.faults', 'bench/x.py') → the flags
    written after it, in a code block's line or an inline code span, up to the next command or
    comment; `tokenyard queue|worker|sim --flow-control off` counts for all three."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    spans += re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    flags: dict[str, set[str]] = {}
    for span in spans:
        span = span.split(" #")[0]
        found = list(COMMAND.finditer(span))
        for i, m in enumerate(found):
            rest = span[m.end():found[i + 1].start() if i + 1 < len(found) else None]
            names = [f"tokenyard {c}" for c in m[1].split("|")] if m[1] else [m[2] or m[3]]
            for name in names:
                flags.setdefault(name, set()).update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest))
    return flags


def test_every_flag_readme_gives_a_subcommand_is_one_it_takes():
    from tokenyard.cli import build_parser, every_parser

    takes = {p.prog: {o for a in p._actions for o in a.option_strings} for p in every_parser(build_parser())}
    shown = {name: f for name, f in readme_flags().items() if name.startswith("tokenyard ")}
    assert sorted(set(shown) - set(takes)) == []  # no subcommand README names is missing
    assert {"tokenyard up", "tokenyard sim", "tokenyard bench serve", "tokenyard router"} <= set(shown)
    assert "--bench-prompts" in shown["tokenyard up"] and "--flow-control" in shown["tokenyard worker"]
    assert {name: sorted(f - takes[name]) for name, f in shown.items() if f - takes[name]} == {}


def test_every_bench_the_readme_names_answers_help():
    commands = readme_benches()
    assert len(commands) >= 20  # the README's Benchmarks section and the sections before it

    def run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
        return cmd, subprocess.run([*cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)

    flags = readme_flags()
    assert "--probe" in flags["bench.faults"] and "--baseline" in flags["bench.control_plane"]
    with ThreadPoolExecutor(4) as pool:
        for cmd, out in pool.map(run, commands):
            assert out.returncode == 0, (cmd, out.stderr[-2000:])
            assert "usage" in out.stdout.lower() and "Traceback" not in out.stderr, (cmd, out.stdout, out.stderr)
            shown = flags.get(cmd[-1], set())
            assert [f for f in sorted(shown) if not re.search(re.escape(f) + r"(?![\w-])", out.stdout)] == [], cmd


def test_live_paths_runs_live_routers_fleet_at_its_speed():
    """live_paths kept speed 0.1 after live_router moved to 0.25: at README's `--load 3` (and
    in a newcomer's run at load 1) admission refused most of its requests (32 of 40)."""
    from bench import live_paths, live_router

    assert live_paths.parser().parse_args([]).speed == live_router.SPEED == 0.25


def test_the_vllm_bench_without_its_extra_says_what_to_install(monkeypatch):
    """README's `python bench/vllm_worker_overhead.py` "(needs the vllm extra)" died without it in
    a traceback from deep in the tiny model's builder (No module named 'transformers')."""
    import importlib.util

    import pytest

    from bench import vllm_worker_overhead as bench

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--repeats", "1"])
    assert str(stop.value).startswith("bench/vllm_worker_overhead.py needs vLLM (vllm not installed): bash deploy/bootstrap.sh test,vllm")


def test_live_paths_scrapes_each_fleets_metrics_endpoints(monkeypatch, tmp_path):
    """README's `python -m bench.live_paths --load 3` ran its benchmark and then died in
    live_router's scrape, handed the fleet instead of its endpoints ('FleetProcesses' object has
    no attribute 'values'). A stand-in fleet and bench: each path's row carries what the scrape
    read from that fleet's endpoints."""
    import asyncio

    from bench import live_paths

    scraped = []

    class Fleet:
        nats_url, http_url = "nats://fake", "http://fake"

        def __init__(self, **kw):
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        def scrape_targets(self):
            return {"queue": "http://127.0.0.1:9/metrics"}

    async def bench(cfg):
        return {"completed": 3, "failed": 0, "median_ttft_ms": 10.0}

    monkeypatch.setattr(live_paths, "FleetProcesses", Fleet)
    monkeypatch.setattr(live_paths, "run_bench", bench)
    monkeypatch.setattr(live_paths, "_scrape", lambda targets: scraped.append(dict(targets)) or {"x": 1.0})
    args = live_paths.parser().parse_args(["--log-dir", str(tmp_path), "--num-prompts", "3"])
    doc = asyncio.run(live_paths.run(args))
    assert scraped == [{"queue": "http://127.0.0.1:9/metrics"}] * 2
    assert [(r["path"], r["completed"], r["median_ttft_ms"], r["fleet_metrics"]) for r in doc["runs"]] == [
        ("nats", 3, 2.5, {"x": 1.0}), ("http", 3, 2.5, {"x": 1.0})]
