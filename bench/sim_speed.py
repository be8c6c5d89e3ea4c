"""How fast the cluster simulator runs, and how much memory it needs.

    python -m bench.sim_speed [--policy multiplicative] [--requests N] [--json FILE]

(a) Speed: simulated seconds per wall second (`sim_speed`) replaying the Mooncake
    conversation trace (first --requests requests, default 3,000 ≈ its first 1,030 s) on
    16 and on 128 a100-llama3-8b instances, each at the trace's own rate (×1) and at a rate
    that gives every instance the same load as 16 instances at ×1 (×8 for 128). Target:
    ≥ 100× at 128 instances.
(b) Memory: peak resident set size (ru_maxrss) of a process that replays the full trace
    (12,031 requests, 3,537 s) on 128 instances, and that run's speed.

Each point runs in its own subprocess, so one's memory does not inflate the next's.
Wall-clock figures depend on the machine and its load; the simulated results do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, resource, sys
from tokenyard.loadgen.workloads import open_workload
from tokenyard.simulator.cluster import SimConfig
from tokenyard.simulator.run import simulate
trace, n, instances, scale, policy = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
w = open_workload(trace, num_requests=None if n == "all" else int(n), rate_scale=scale)
r = simulate(w, SimConfig(instances=instances, policy=policy))
print(json.dumps({
    "instances": instances, "rate_scale": scale, "requests": len(w.items()), "policy": policy,
    "sim_time_s": r["sim_time_s"], "wall_s": r["wall_s"], "sim_speed": r["sim_speed"],
    "completed": r["completed"], "mean_ttft_ms": r["mean_ttft_ms"],
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def point(n: str, instances: int, scale: float, policy: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "mooncake", n, str(instances), str(scale), policy],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # the child's own error, not a CalledProcessError around it
        raise SystemExit(f"sim_speed: the {instances}-instance run failed:\n{out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="multiplicative")
    ap.add_argument("--requests", default="3000")
    ap.add_argument("--skip-full", action="store_true", help="skip (b), the full-trace memory run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for instances, scale in ((16, 1.0), (128, 1.0), (128, 8.0)):
        rows.append(point(args.requests, instances, scale, args.policy))
        print(json.dumps(rows[-1]), flush=True)
    if not args.skip_full:
        rows.append(point("all", 128, 1.0, args.policy))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    fast = [r for r in rows if r["instances"] == 128]
    return 0 if all(r["sim_speed"] >= 100 for r in fast) else 1


if __name__ == "__main__":
    sys.exit(main())
