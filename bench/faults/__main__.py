"""`python -m bench.faults`: run the probes (see bench/faults/__init__.py), print one row each,
optionally write them all as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import bench.faults as package
from bench._out import write_result
from bench.faults.chaos import layout, probe_chaos
from bench.faults.fronts import probe_front_kill
from bench.faults.kills import probe_queue_kill, probe_worker_kill
from bench.faults.nats_restart import probe_nats_restart
from bench.faults.overload import probe_overload_rss
from bench.faults.replicas import probe_edge_kill, probe_queue_replica_kill

PROBES = {
    "worker-kill": lambda args: probe_worker_kill(args, True),
    "worker-kill-off": lambda args: probe_worker_kill(args, False),
    "nats-restart": probe_nats_restart,
    "queue-kill": probe_queue_kill,
    "overload-rss": probe_overload_rss,
    "edge-kill": lambda args: (probe_front_kill if layout(args) == "in-queue" else probe_edge_kill)(args),
    "queue-replica-kill": probe_queue_replica_kill,
}
NOT_BY_DEFAULT = {"chaos": probe_chaos}
"""Run only when named (`--probe chaos`): it breaks four things in one run of its own."""
COLUMNS = ("probe", "sent", "completed", "failed_clean", "hung", "duplicated", "gaps", "silent_short")


def print_row(row: dict) -> None:
    if "completed" in row:
        print("  ".join(f"{c}={row.get(c, '-')}" for c in COLUMNS))
    rest = {k: v for k, v in row.items() if k not in COLUMNS}
    print("    " + json.dumps(rest))
    sys.stdout.flush()


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=package.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", action="append", choices=[*PROBES, *NOT_BY_DEFAULT], metavar="NAME",
                    help=f"a probe to run, repeatable: {', '.join([*PROBES, *NOT_BY_DEFAULT])} "
                         "(default: all but chaos)")
    ap.add_argument("--profile", default="a100-llama3-8b",
                    help="the simulated workers' latency profile (default: %(default)s)")
    ap.add_argument("--streams", type=int, default=100, help="worker-kill: concurrent streams")
    ap.add_argument("--tokens", type=int, default=300, help="worker-kill: tokens per stream")
    ap.add_argument("--restart-streams", type=int, default=60,
                    help="nats-restart: streams of 400 tokens, a third read each way")
    ap.add_argument("--queued", type=int, default=1200,
                    help="queue-kill: requests queued before the queue is killed (default: %(default)s)")
    ap.add_argument("--overload-s", type=float, default=60.0,
                    help="overload-rss: seconds of load at 10× the fleet's measured capacity (default: %(default)s)")
    ap.add_argument("--overload-workers", type=int, default=2,
                    help="overload-rss: simulated workers in the fleet (default: %(default)s)")
    ap.add_argument("--overload-speed", type=float, default=0.1,
                    help="overload-rss: the simulated workers' speed (small: a capacity this machine can offer 10× of)")
    ap.add_argument("--capacity-concurrency", type=int, default=128,
                    help="overload-rss: concurrent clients of the closed loop that measures the fleet's capacity (default: %(default)s)")
    ap.add_argument("--edge-streams", type=int, default=40, help="edge-kill: concurrent HTTP streams")
    ap.add_argument("--layout", choices=("in-queue", "apart"), default="in-queue",
                    help="edge-kill, chaos: the HTTP edge in the queue's process (up's default: its death is the "
                         "queue's, admission's and the router's) or in processes of its own (up --edge-processes 2)")
    ap.add_argument("--then-kill-worker", action="store_true",
                    help="edge-kill (in-queue): SIGKILL worker 0 too, --worker-kill-after s after the front")
    ap.add_argument("--worker-kill-after", type=float, default=5.0,
                    help="--then-kill-worker: seconds after the front (the hand-over comes 3-9 s after it)")
    ap.add_argument("--nats-via", choices=("raw", "client"), default="raw",
                    help="edge-kill: how its NATS streams are read: raw (a subscription each, no client logic) or "
                         "client (one TokenyardClient: it resumes a stream whose worker and router are both gone) "
                         "(default: %(default)s)")
    ap.add_argument("--replica-streams", type=int, default=400, help="queue-replica-kill: P3 streams")
    ap.add_argument("--replica-tokens", type=int, default=64, help="queue-replica-kill: tokens per stream")
    ap.add_argument("--deadline-s", type=float, default=90.0, help="after the fault: later = hung")
    ap.add_argument("--chaos-seed", type=int, default=1, help="chaos: the seed of its faults' order and times and of its load")
    ap.add_argument("--chaos-s", type=float, default=90.0, help="chaos: seconds of load (the faults fall within them)")
    ap.add_argument("--chaos-rate", type=float, default=6.0, help="chaos: requests a second, half HTTP, half NATS")
    ap.add_argument("--baseline", default=None,
                    help="chaos, edge-kill (in-queue): run the fleet's processes on this commit's code (e.g. main), the probe's own")
    ap.add_argument("--log-dir", default=None,
                    help="write each fleet process's log to NAME.log in this folder (default: logs discarded)")
    ap.add_argument("--json", default=None, help="write every probe's row as JSON to this file (default: not written)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENYARD_LOG_LEVEL", "WARNING")
    rows = []
    for name in args.probe or PROBES:
        out = await {**PROBES, **NOT_BY_DEFAULT}[name](args)
        for row in out if isinstance(out, list) else [out]:
            print_row(row)
            rows.append(row)
    write_result(args.json, {"rows": rows}, "python -m bench.faults", argv)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
