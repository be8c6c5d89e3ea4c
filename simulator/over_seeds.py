"""`tokenyard sim … --seeds 101-112 [--jobs N]`: the comparison `tokenyard sim` makes, once per
seed, then summarised (simulator/seeds.py) and shown (simulator/seeds_report.py).

Seed s draws the workload (arrivals, lengths, priorities) and seeds the policies, as `--seed s`
would; every policy of one seed runs on the same requests, so their differences pair by seed.
Each seed's run is `--seed s`'s, bit for bit but for wall time, whatever `--jobs`: a seed runs
whole in one process (its policies share one prefix-chain cache, as `--compare` does), and
the runs are gathered in the order of `--seeds`. So the summary is the same with any N.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tokenyard.simulator import report
from tokenyard.simulator.cli import config_doc, prepare, run
from tokenyard.simulator.seeds import parse_seeds, summarise
from tokenyard.simulator.seeds_report import print_summary


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """{"seed": seed, "policies": {name: result}}: the comparison at `seed`."""
    return {"seed": seed, "policies": run(prepare(args, seed))}


def main(args: argparse.Namespace) -> int:
    try:
        seeds = parse_seeds(args.seeds)
        if args.jobs < 1:
            raise ValueError("--jobs must be >= 1")
        if args.plots:
            raise ValueError("--plots draws one run; use --seed S with it, not --seeds")
        first = prepare(args, seeds[0])  # bad options fail here, before any run
    except (ValueError, KeyError) as e:
        print(f"tokenyard sim: error: {e}", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    jobs = min(args.jobs, len(seeds))
    if jobs == 1:
        for seed in seeds:
            runs.append(run_seed(args, seed))
            _progress(args, runs[-1])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for done in pool.map(run_seed, [args] * len(seeds), seeds):  # in the order of --seeds
                runs.append(done)
                _progress(args, done)
    goodput = bool(first.goodput)
    summary = summarise(runs, goodput=goodput)
    if not args.quiet:
        title = f"{args.workload} · {args.instances} × {args.profile}"
        print_summary(summary, title, goodput, kind="mode" if len(first.modes) > 1 else "policy")
    if args.json:
        config = config_doc(args, first.workload, first.names)
        config.update(seed=None, seeds=seeds, jobs=args.jobs)
        report.write_json({"config": config, "runs": runs, "summary": summary}, args.json)
    return 0


def _progress(args: argparse.Namespace, done: dict[str, Any]) -> None:
    """One line per seed on stderr: its met-SLO counts, the spread as it comes."""
    if args.quiet:
        return
    met = ", ".join(f"{name} {res['outcomes']['all']['met_slo']}" for name, res in done["policies"].items())
    print(f"seed {done['seed']}: met SLO {met}", file=sys.stderr, flush=True)
