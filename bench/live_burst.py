"""A live burst of ~10× the fleet's capacity (issue 11): `tokenyard up` as a user starts it
(real nats-server and service processes, simulated A100 engines at real time), then a burst
from loadgen over NATS. Reports when the first refusal came (after the burst's first request)
and the admitted requests' TTFTs per class against their targets (shared.slo).

    python -m bench.live_burst [--workers 2] [--factor 10] [--seconds 4] [--input-len 2000]
                               [--output-len 100] [--mix 0,0.6,0.3,0.1] [--out FILE.json]

The fleet's capacity C (requests/s) is measured first by the cluster simulator on the same
fleet and request shape (same cores, same profile), offered far above what it serves; the
burst then sends factor × C requests/s (Poisson) for `seconds`. Classes are asked for with
vLLM's `priority` field, so P0 is not in the default mix: admission caps a tenant at P1
unless its tenant policy allows P0 (DESIGN §3.2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np


def capacity(workers: int, input_len: int, output_len: int, profile: str) -> float:
    """Requests per second the fleet completes when offered far more (simulator)."""
    from tokenyard.loadgen.workloads.blocks import TraceRequest
    from tokenyard.simulator.cluster import ClusterSim, SimConfig

    rng = np.random.default_rng(1)
    n, rate = 1500, 400.0
    items = [TraceRequest(i, float(t), input_len, output_len, 1, tuple(int(x) for x in rng.integers(1 << 40, size=input_len // 16)))
             for i, t in enumerate(np.cumsum(rng.exponential(1 / rate, n)))]
    sim = ClusterSim(SimConfig(instances=workers, profile=profile, slo_check=False, deadline_reject=False), 16)
    sim.run(items)
    done = sorted(st.tokens[-1] for st in sim.reqs.values() if st.finished)
    k = len(done) // 4  # the steady middle half
    return (len(done) - 2 * k) / (done[-k - 1] - done[k])


async def burst(url: str, rate: float, seconds: float, input_len: int, output_len: int, mix) -> list:
    from tokenyard.loadgen.config import BenchConfig
    from tokenyard.loadgen.serve import drive
    from tokenyard.loadgen.targets import open_target
    from tokenyard.loadgen.workload import make_workload

    cfg = BenchConfig(target=url, num_prompts=int(rate * seconds), input_len=input_len, output_len=output_len,
                      rate=rate, priority_mix=mix, request_timeout_s=120.0, progress=False)
    requests = sorted(make_workload(cfg).requests(), key=lambda r: (r.arrival_s, r.index))
    target = await open_target(cfg.target, cfg.model, cfg.request_timeout_s, None, None, cfg.connect_timeout_s)
    try:
        records, _ = await drive(requests, target, cfg)
    finally:
        await target.close()
    return records


def report(records) -> dict[str, Any]:
    """Times are from the burst's first request on the wire."""
    from tokenyard.shared.slo import ttft_target_s

    t0 = min(r.send_s for r in records)
    refused = [r for r in records if r.error and r.error.startswith("status_")]
    first = min((r.end_s for r in refused), default=None)
    out: dict[str, Any] = {
        "sent": len(records),
        "refused": {e: sum(r.error == e for r in refused) for e in sorted({r.error for r in refused})},
        "other_failures": sum(1 for r in records if r.error and not r.error.startswith("status_")),
        "first_refusal_after_s": None if first is None else first - t0,
        "refusals_at_s": sorted(round(r.end_s - t0, 2) for r in refused)[:10],
        "by_class": {},
    }
    for c in range(4):
        ok = [r.ttft for r in records if r.priority == c and r.success]
        if not ok:
            continue
        p99 = float(np.percentile(ok, 99))
        out["by_class"][f"P{c}"] = {"served": len(ok), "sent": sum(r.priority == c for r in records),
                                    "p50_ttft_s": float(np.median(ok)), "p99_ttft_s": p99,
                                    "p99_over_target": p99 / ttft_target_s(c), "max_ttft_s": max(ok)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--profile", default="a100-llama3-8b")
    p.add_argument("--factor", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--input-len", type=int, default=2000)
    p.add_argument("--output-len", type=int, default=100)
    p.add_argument("--mix", default="0,0.6,0.3,0.1")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from tokenyard.loadgen.config import parse_priority_mix

    mix = parse_priority_mix(args.mix)
    cap = capacity(args.workers, args.input_len, args.output_len, args.profile)
    rate = args.factor * cap
    print(f"capacity {cap:.1f} req/s (simulator); burst {rate:.1f} req/s for {args.seconds:g} s", flush=True)
    up = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "tokenyard"), "up", "--workers", str(args.workers),
                           "--profile", args.profile], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in up.stdout:  # type: ignore[union-attr]
            m = re.search(r"NATS\s+(nats://\S+)", line)
            if m:
                url = m.group(1)
            if "Ctrl-C" in line:
                break
        if url is None:
            raise RuntimeError("tokenyard up did not start")
        time.sleep(1.0)  # a few heartbeat rounds: every service has seen the workers
        records = asyncio.run(burst(url, rate, args.seconds, args.input_len, args.output_len, mix))
        doc = {"capacity_req_s": cap, "burst_req_s": rate, **vars(args), **report(records)}
    finally:
        up.send_signal(2)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
    print(json.dumps({k: v for k, v in doc.items() if k not in ("out",)}, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
