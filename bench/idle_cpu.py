"""What an idle fleet burns: CPU milliseconds per wall second of each process group of
`tokenyard up`'s fleet (nats-server, edge processes, the queue's process with admission and
the router, macro, the workers together) while no request is in flight: heartbeats, polls,
ticks and stats loops.

    python -m bench.idle_cpu [--workers 4] [--speed 0.25] [--window 20] [--rounds 2]
                             [--baseline REF] [--json FILE]

With `--baseline REF`, a second fleet on REF's code (bench/baseline.py) runs beside this
tree's, and the two are sampled over the same windows, so a shared machine's load falls on
both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._out import write_result
from bench.baseline import baseline_env
from bench.hop_profile import cpu_seconds
from tokenyard.launcher import FleetProcesses

SETTLE_S = 3.0
"""After start-up, before the first window: the services' first heartbeats and plans."""


def _group(name: str) -> str:
    return "edge" if name.startswith("edge") else name


def rates(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """CPU ms per wall second by process group (edge processes summed), and their total."""
    out: dict[str, float] = {}
    for name, v in after.items():
        key = _group(name)
        out[key] = out.get(key, 0.0) + (v - before.get(name, 0.0)) * 1e3 / wall_s
    out = {k: round(v, 2) for k, v in out.items()}
    out["fleet"] = round(sum(out.values()), 2)
    return out


async def main_async(args) -> dict[str, Any]:
    labels = ["this tree"] + (["baseline"] if args.baseline else [])
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        envs = {"this tree": {}}
        if args.baseline:
            envs["baseline"] = stack.enter_context(baseline_env(args.baseline))
        fleets = {label: FleetProcesses(workers=args.workers, speed=args.speed, http_port=0,
                                        extra_env=envs[label]) for label in labels}
        async with contextlib.AsyncExitStack() as up:
            for fleet in fleets.values():
                await up.enter_async_context(fleet)
            await asyncio.sleep(SETTLE_S)
            for rnd in range(1, args.rounds + 1):
                load = os.getloadavg()[0]
                before, t0 = {label: cpu_seconds(f) for label, f in fleets.items()}, time.monotonic()
                await asyncio.sleep(args.window)
                wall = time.monotonic() - t0
                for label, f in fleets.items():
                    row = {"round": rnd, "fleet": label, "wall_s": round(wall, 1),
                           "load_avg": [round(load, 1), round(os.getloadavg()[0], 1)],
                           "cpu_ms_per_s": rates(before[label], cpu_seconds(f), wall)}
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    return {"config": {k: v for k, v in vars(args).items() if k != "func"}, "runs": runs}


def table(doc: dict[str, Any]) -> str:
    groups: list[str] = []
    for r in doc["runs"]:
        groups += [g for g in r["cpu_ms_per_s"] if g not in groups]
    lines = ["| round | fleet | load average | " + " | ".join(groups) + " |",
             "|---|---|---|" + "---:|" * len(groups)]
    for r in doc["runs"]:
        cells = [f"{r['cpu_ms_per_s'].get(g, 0.0):.1f}" for g in groups]
        lines.append(f"| {r['round']} | {r['fleet']} | {r['load_avg'][0]} → {r['load_avg'][1]} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="simulated workers in each fleet (default: 4)")
    p.add_argument("--speed", type=float, default=0.25, help="the workers' --speed (default: 0.25, the live benches')")
    p.add_argument("--window", type=float, default=20.0, help="seconds each sample spans (default: 20)")
    p.add_argument("--rounds", type=int, default=2, help="samples taken (default: 2)")
    p.add_argument("--baseline", default=None, help="also run a fleet on this commit's code, side by side")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args()
    doc = asyncio.run(main_async(args))
    print(table(doc))
    write_result(args.json, doc, prog="python -m bench.idle_cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
