"""tokenyard's live fleet at bench/live_router.py's settings, the client on the edge's HTTP
port and straight on NATS (no edge), one run after the other: what the edge adds.

    python -m bench.live_paths [--load 3] [--paths nats,http] [--num-prompts 150] [--json FILE]

The fleet is live_router's (4 simulated a100-llama3-8b workers at its speed, 0.25, the default
router, chatbot at its rate × load × speed × workers / 16) with NATS security off, so the
benchmark's NATS client needs no credentials; a fresh fleet per path. TTFT / TPOT in
simulated ms (wall × speed), plus the fleet's own metrics (queue wait, router time) and the
router's orphan aborts (requests it aborted because their client's lease fell silent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.serve import run_bench
from tokenyard.loadgen.workloads.synthetic import SYNTHETIC

from bench._out import log_dir, write_result
from bench.live_router import PROFILE, SPEED, _scrape
from tokenyard.launcher import FleetProcesses

KEYS = ("completed", "failed", "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms", "p99_tpot_ms")


async def run(args) -> dict:
    rate = SYNTHETIC[args.workload].DEFAULT_RATE * args.load * args.speed * args.workers / 16
    rows = []
    logs_dir = log_dir(args.log_dir, "live-paths")
    for path in args.paths:
        logs = logs_dir / path
        fleet = FleetProcesses(workers=args.workers, profile=PROFILE, speed=args.speed, http_port=0,
                               nats_secure=False, log_dir=str(logs))
        async with fleet:
            load_avg = os.getloadavg()[0]
            bench = BenchConfig(workload=args.workload, num_prompts=args.num_prompts, rate=rate, seed=args.seed,
                                progress=False, target=fleet.http_url if path == "http" else fleet.nats_url)
            res = await run_bench(bench)
            metrics = await asyncio.to_thread(_scrape, fleet.scrape_targets())
        router_log = logs / "router.log"
        orphans = router_log.read_text().count('"orphan_aborted"') if router_log.exists() else 0
        row = {"path": path, "load": args.load, "rate": rate,
               "load_avg": [round(load_avg, 1), round(os.getloadavg()[0], 1)],
               **{k: res.get(k) * args.speed if k.endswith("_ms") and res.get(k) is not None else res.get(k)
                  for k in KEYS},
               "orphan_aborts": orphans, "fleet_metrics": metrics}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"runs": rows}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.live_paths", description=__doc__.split("\n\n")[0])
    p.add_argument("--load", type=float, default=3.0,
                   help="offered rate as a multiple of the workload's own rate, scaled by speed and by workers / 16 (default: %(default)s)")
    p.add_argument("--paths", type=lambda s: s.split(","), default=["nats", "http"],
                   help="client paths to run, comma list of nats (straight on NATS) and http (through the edge), "
                        "a fresh fleet each (default: nats,http)")
    p.add_argument("--workers", type=int, default=4, help="simulated a100-llama3-8b workers (default: %(default)s)")
    p.add_argument("--speed", type=float, default=SPEED,
                   help=f"simulated seconds per wall second, live_router's (default {SPEED}; at 0.1 admission "
                        "refuses most requests: a simulated A100 decodes slower than the 100 ms TPOT SLO)")
    p.add_argument("--workload", default="chatbot", choices=list(SYNTHETIC),
                   help="synthetic workload the requests come from (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=150, help="requests sent on each path (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the requests and their arrival times (default: %(default)s)")
    p.add_argument("--log-dir", default=None,
                   help="each path's fleet logs go to DIR/PATH; the router's log gives the orphan aborts (default: a new temporary folder, named on stderr)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON to this file (default: not written)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if bad := [x for x in args.paths if x not in ("nats", "http")]:
        p.error(f"unknown path(s) {bad}: nats, http")
    doc = asyncio.run(run(args))
    write_result(args.json, doc, prog="python -m bench.live_paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
