"""Every benchmark README.md names answers `--help` with its usage: no traceback, no run
started (bench/edge_profile.py read `--help` as its stream count and died; run_ecoserve.sh
took it for its output folder and started its first run)."""

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


def test_every_bench_the_readme_names_answers_help():
    commands = readme_benches()
    assert len(commands) >= 20  # the README's Benchmarks section and the sections before it

    def run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
        return cmd, subprocess.run([*cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        for cmd, out in pool.map(run, commands):
            assert out.returncode == 0, (cmd, out.stderr[-2000:])
            assert "usage" in out.stdout.lower() and "Traceback" not in out.stderr, (cmd, out.stdout, out.stderr)


def test_live_paths_runs_live_routers_fleet_at_its_speed():
    """live_paths kept speed 0.1 after live_router moved to 0.25: at README's `--load 3` (and
    in a newcomer's run at load 1) admission refused most of its requests (32 of 40)."""
    from bench import live_paths, live_router

    assert live_paths.parser().parse_args([]).speed == live_router.SPEED == 0.25
