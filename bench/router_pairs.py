"""`tokenyard bench router` on another commit's code and on this tree's, round after round.

    python -m bench.router_pairs --baseline REF [--rounds 3] [--instances 256] [--json FILE]

Each round runs the benchmark twice, one process each, REF's code (bench/baseline.py puts a
`git archive` of REF first on the child's PYTHONPATH) and this tree's, the order alternating
from round to round, so both see the machine at nearly the same moments. Every run is
printed with the 1-minute load average at its start; the figures are `tokenyard bench
router`'s own (µs: `p50` / `p99` = the first pass's wall clock, issue 12's figure; `cpu` = the
first pass's thread CPU time; `floor` = each decision's least CPU time over the passes, what
the code costs with the machine's interference taken out as far as it can be).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._out import write_result
from bench.baseline import baseline_env, commit_of

FIGURES = ("p50_us", "p99_us", "cpu_p50_us", "cpu_p99_us", "floor_p50_us", "floor_p99_us")


def run_once(instances: int, env: dict[str, str] | None) -> dict:
    cmd = [sys.executable, "-m", "tokenyard.cli", "bench", "router", "--instances", str(instances), "--json"]
    out = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_pairs", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, metavar="REF", help="the commit to compare with")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds, each one run of REF's code and one of this tree's (default: %(default)s)")
    p.add_argument("--instances", type=int, default=256,
                   help="simulated workers in each run, tokenyard bench router's --instances (default: %(default)s)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the runs as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    ref = commit_of(args.baseline)
    runs = []
    with baseline_env(ref) as env:
        for r in range(args.rounds):
            codes = [(ref[:7], env), ("this tree", None)]
            for name, code_env in codes if r % 2 == 0 else codes[::-1]:
                load = os.getloadavg()[0]
                res = run_once(args.instances, code_env)
                runs.append({"round": r + 1, "code": name, "load": round(load, 2), **res})
                print(f"round {r + 1} load {load:5.2f} {name:9s} "
                      + " ".join(f"{k.removesuffix('_us').replace('_', ' ')} {res[k]:6.1f}" for k in FIGURES),
                      flush=True)
    write_result(args.json, {"baseline": ref, "instances": args.instances, "runs": runs},
                 prog="python -m bench.router_pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
