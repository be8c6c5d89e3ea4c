"""The evaluation behind docs/RESULTS.md: every routing policy on the same 16-instance fleet
(a100-llama3-8b), on the Mooncake conversation trace and seed 000's three synthetic
workloads, across a load sweep ×0.5, ×1, ×1.5, ×2, ×3 of each workload's own rate.

    python -m bench.run_results [--jobs 2] [--out docs/results] [--only mooncake,api] [--loads 1,2]

Each (workload, load) point is one `tokenyard sim --compare …` command, printed as it runs
and recorded in its JSON (`command`); results go to OUT/<workload>_x<load>.json, the
Mooncake ×1 and ×2 points also get PNG plots under OUT/plots_<workload>_x<load>/. Points
run in parallel processes (`--jobs`); each is deterministic, so the numbers do not depend
on the machine (only `sim_speed` / `wall_s` do). Then `python -m bench.results_doc` turns
the JSONs into the tables of docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

POLICIES = "multiplicative,multiplicative-exact,llmd,dynamo,sglang,least-loaded,round-robin"
LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)
GOODPUT = ("ttft:2000", "tpot:100")
WORKLOADS: dict[str, tuple[str, int | None]] = {
    # name → (--workload, --num-requests). Mooncake: the first 3,000 of its 12,031 requests
    # (its first ~1,030 s); the synthetic ones make that many requests at ×1 of their base rate.
    "mooncake": ("mooncake", 3000),
    "chatbot": ("chatbot", 3000),
    "api": ("api", 4000),
    "coder": ("coder", 2000),
    # The whole trace (12,031 requests, 3,537 s), run at ×1 and ×2 only (`--only mooncake-full
    # --loads 1,2`): the check that the 3,000-request prefix does not mislead.
    "mooncake-full": ("mooncake", None),
}
DEFAULT_ONLY = ("mooncake", "chatbot", "api", "coder")
PLOTTED = {("mooncake", 1.0), ("mooncake", 2.0)}


def command(name: str, load: float, out: Path) -> list[str]:
    spec, n = WORKLOADS[name]
    cmd = [
        "tokenyard", "sim", "--workload", spec, *(["--num-requests", str(n)] if n else []), "--instances", "16",
        "--profile", "a100-llama3-8b", "--compare", POLICIES, "--rate-scale", f"{load:g}",
        "--goodput", *GOODPUT, "--seed", "0", "--quiet", "--json", str(out / f"{name}_x{load:g}.json"),
    ]  # fmt: skip
    if (name, load) in PLOTTED:
        cmd += ["--plots", str(out / f"plots_{name}_x{load:g}")]
    return cmd


def shown(cmd: list[str]) -> str:
    """The command as a reader types it: paths relative to the repository root."""
    text = shlex.join(cmd)
    return text.replace(str(ROOT) + "/", "")


def run_point(name: str, load: float, out: Path) -> tuple[str, float, float, int]:
    cmd = command(name, load, out)
    exe = [sys.executable, "-m", "tokenyard.cli", *cmd[1:]]
    t0 = time.perf_counter()
    proc = subprocess.run(exe, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode == 0:
        path = out / f"{name}_x{load:g}.json"
        doc = json.loads(path.read_text())
        doc["command"] = shown(cmd)
        path.write_text(json.dumps(doc, indent=2) + "\n")
    else:
        print(proc.stderr, file=sys.stderr)
    return name, load, wall, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="points run at once, each in a process of its own (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"),
                    help="folder the points' JSONs and plots go to (default: docs/results in this repository)")
    ap.add_argument("--only", default=",".join(DEFAULT_ONLY), help=f"workloads, comma-separated: {', '.join(WORKLOADS)}")
    ap.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS),
                    help="loads, each a multiplier of the workload's own arrival rate, comma list (default: %(default)s)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    points = [(w, float(x)) for w in args.only.split(",") for x in args.loads.split(",")]
    for w, x in points:
        print(shown(command(w, x, out)), flush=True)
    failed = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, load, wall, rc in pool.map(lambda p: run_point(p[0], p[1], out), points):
            print(f"{name} ×{load:g}: {'ok' if rc == 0 else f'FAILED rc={rc}'} in {wall:.0f} s", flush=True)
            failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
