"""A live burst of ~10× the fleet's capacity (issue 11): `tokenyard up` as a user starts it
(real nats-server and service processes, simulated A100 engines at real time), then a burst
from loadgen over NATS. Reports when the first refusal came (after the burst's first request),
the admitted requests' TTFTs per class against their targets (shared.slo), and how far the
queue's intake trailed admission (`queue_intake`, from the queue states seen during the burst).

    python -m bench.live_burst [--workers 2] [--factor 10] [--seconds 4] [--input-len 2000]
                               [--output-len 100] [--mix 5,60,30,5] [--out FILE.json]
                               [--log-dir DIR]

With `--log-dir`, `first_refusal_answer` splits the first refusal's answer time: admission's
part (its `rejected` log line, written just after the answer, on the wall clock) and the load
generator's reading it after that.

The fleet's capacity C (requests/s) is measured first by the cluster simulator on the same
fleet and request shape (same cores, same profile), offered far above what it serves; the
burst then sends factor × C requests/s (Poisson) for `seconds`. The default class mix is the
design's, P0/P1/P2/P3 = 5/60/30/5 (DESIGN §3.2): the load goes in as tenant `burst`, whose
policy (`tokenyard up --tenants`, the file below) lets it ask for P0 — admission caps a tenant
without one at P1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bench._out import write_result

TENANT = "burst"
TENANTS = f'[tenants.{TENANT}]\nceiling = "P0"\n'
"""The burst's tenant may ask for any class (the default policy caps at P1, DESIGN §3.2)."""


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


async def burst(url: str, creds_dir: str, rate: float, seconds: float, input_len: int, output_len: int, mix):
    """The burst's records, and every queue state seen during it: (perf_counter at receipt, the
    state's seen_arrival_s on the perf_counter clock, requests waiting in the queue). The load
    goes in as the fleet's `client` user; the queue states are read as its admin (a client may
    not subscribe to them)."""
    from tokenyard.loadgen.config import BenchConfig
    from tokenyard.loadgen.serve import drive
    from tokenyard.loadgen.targets import open_target
    from tokenyard.loadgen.workload import make_workload
    from tokenyard.shared import codec, nats_auth, natsutil, schemas, subjects

    cfg = BenchConfig(target=url, num_prompts=int(rate * seconds), input_len=input_len, output_len=output_len,
                      rate=rate, priority_mix=mix, request_timeout_s=120.0, progress=False, tenant=TENANT)
    clock = time.time() - time.perf_counter()  # perf_counter → wall clock (the services' log timestamps)
    requests = sorted(make_workload(cfg).requests(), key=lambda r: (r.arrival_s, r.index))
    states: list[tuple[float, float, int]] = []

    async def on_state(msg) -> None:
        s = codec.decode(msg.data, schemas.QueueStats)
        now = time.perf_counter()
        states.append((now, s.seen_arrival_s - time.time() + now if s.seen_arrival_s else 0.0, sum(s.depth)))

    nc = await natsutil.connect(url, "live-burst-observer", creds=nats_auth.load_creds(os.path.join(creds_dir, "admin.creds")))
    await nc.subscribe(subjects.QUEUE_STATE, cb=on_state)
    target = await open_target(cfg.target, cfg.model, cfg.request_timeout_s, None, cfg.tenant, cfg.connect_timeout_s)
    try:
        records, _ = await drive(requests, target, cfg)
    finally:
        await target.close()
        await nc.close()
    return records, states, clock


def admission_answered(records, log_dir: str, clock: float) -> dict[str, Any]:
    """Where the first refusal's answer time went, from admission's log (`--log-dir`): when
    admission answered it (its `rejected` line, written just after the answer; wall clock) after
    the request was sent, and when the load generator read the answer after that."""
    import datetime

    refused = [r for r in records if r.error and r.error.startswith("status_")]
    if not refused:
        return {}
    r = min(refused, key=lambda r: r.end_s)
    suffix = f'-{r.index}"'
    # admission logs in the queue's process by default (`up --admission in-queue`)
    name = "admission.log" if os.path.exists(os.path.join(log_dir, "admission.log")) else "queue.log"
    with open(os.path.join(log_dir, name)) as f:
        line = next((x for x in f if '"rejected"' in x and suffix in x), None)
    if line is None:
        return {}
    stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
    answered = datetime.datetime.fromisoformat(stamp).timestamp() - clock
    return {"admission_answered_after_send_s": answered - r.send_s, "client_read_after_answer_s": r.end_s - answered}


def intake(records, states) -> dict[str, Any]:
    """How far the queue's intake trails admission during the burst, from its states: lag = when
    the state arrived − the arrival of the latest request the queue had taken in, and how many
    of the burst's requests were sent before the state but after that request (what an
    admission that wiped its count at each state, as it did before, forgot)."""
    sends = np.sort([r.send_s for r in records])
    t0, t1 = sends[0], sends[-1]
    during = [(t, seen, d) for t, seen, d in states if t0 <= t <= t1 + 1.0 and seen > 0]
    if not during:
        return {}
    lag = np.array([t - seen for t, seen, _ in during])
    unseen = np.array([np.searchsorted(sends, t) - np.searchsorted(sends, seen, side="right") for t, seen, _ in during])
    return {"states": len(during), "lag_p50_s": float(np.median(lag)), "lag_max_s": float(lag.max()),
            "unseen_sent_p50": float(np.median(unseen)), "unseen_sent_max": int(unseen.max())}


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
        "other_failures_by_kind": {e: {"count": sum(r.error == e for r in records),
                                       "first_message": next(r.message for r in records if r.error == e)}
                                   for e in sorted({r.error for r in records if r.error and not r.error.startswith("status_")})},
        "first_refusal_after_s": None if first is None else first - t0,
        "first_refusal_by_code_s": {e: min(r.end_s for r in refused if r.error == e) - t0
                                    for e in sorted({r.error for r in refused})},
        "refusals_at_s": sorted(round(r.end_s - t0, 2) for r in refused)[:10],
        "by_class": {},
    }
    if first is not None:
        # What the first refusal was made of: when its request was due and sent, how long its
        # answer took, and how many requests had gone out before it (the simulator's count for
        # the same burst is bench.sim_burst's `arrivals before`).
        r = min(refused, key=lambda r: r.end_s)
        out["first_refused"] = {"scheduled_after_s": r.scheduled_s - min(x.scheduled_s for x in records),
                                "sent_after_s": r.send_s - t0, "answer_s": r.end_s - r.send_s,
                                "sent_before": sum(x.send_s < r.send_s for x in records)}
        lag = [x.send_s - x.scheduled_s for x in records if x.send_s <= first]
        out["send_lag_before_first_refusal_ms"] = {"p50": 1000 * float(np.median(lag)), "max": 1000 * max(lag)}
    for c in range(4):
        sent = [r for r in records if r.priority == c]
        if not sent:
            continue
        ok = [r.ttft for r in sent if r.success]
        lost = [r for r in sent if r.error and r.error.startswith("status_")]
        row: dict[str, Any] = {
            "sent": len(sent), "served": len(ok),
            "refused": {e: sum(r.error == e for r in lost) for e in sorted({r.error for r in lost})},
            "first_refusal_after_s": min((r.end_s for r in lost), default=None)}
        if row["first_refusal_after_s"] is not None:
            row["first_refusal_after_s"] -= t0
        if ok:
            p99 = float(np.percentile(ok, 99))
            row.update({"p50_ttft_s": float(np.median(ok)), "p99_ttft_s": p99,
                        "p99_over_target": p99 / ttft_target_s(c), "max_ttft_s": max(ok)})
        out["by_class"][f"P{c}"] = row
    return out


def start_up(workers: int, profile: str, creds_dir: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """`tokenyard up` as a user runs it (its creds files written to `creds_dir`); returns the
    process and its NATS URL once it is up."""
    up = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "tokenyard"), "up", "--workers", str(workers),
                           "--profile", profile, "--nats-creds-dir", creds_dir, *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in up.stdout:  # type: ignore[union-attr]
        m = re.search(r"NATS\s+(nats://\S+)", line)
        if m:
            url = m.group(1)
        if "Ctrl-C" in line:
            break
    if url is None:
        stop_up(up)
        raise RuntimeError("tokenyard up did not start")
    time.sleep(1.0)  # a few heartbeat rounds: every service has seen the workers
    return up, url


def stop_up(up: subprocess.Popen) -> None:
    up.send_signal(2)
    try:
        up.wait(timeout=30)
    except subprocess.TimeoutExpired:
        up.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="simulated workers `tokenyard up` starts (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b", help="the simulated workers' latency profile (default: %(default)s)")
    p.add_argument("--factor", type=float, default=10.0,
                   help="the burst's rate as a multiple of the fleet's capacity (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=4.0, help="how long the burst lasts, seconds (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=2000, help="prompt tokens of every request (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=100, help="output tokens of every request (default: %(default)s)")
    p.add_argument("--mix", default="5,60,30,5", help="P0,P1,P2,P3 shares (default: the design's)")
    p.add_argument("--out", default=None, help="write the result as JSON to this file (default: not written)")
    p.add_argument("--log-dir", default=None, help="keep every service's log here (tokenyard up --log-dir)")
    args = p.parse_args(argv)
    from tokenyard.loadgen.config import parse_priority_mix

    mix = parse_priority_mix(args.mix)
    cap = capacity(args.workers, args.input_len, args.output_len, args.profile)
    rate = args.factor * cap
    print(f"capacity {cap:.1f} req/s (simulator); burst {rate:.1f} req/s for {args.seconds:g} s", flush=True)
    creds_dir = tempfile.mkdtemp(prefix="tokenyard-burst-")
    tenants = os.path.join(creds_dir, "tenants.toml")
    with open(tenants, "w") as f:
        f.write(TENANTS)
    up, url = start_up(args.workers, args.profile, creds_dir, "--tenants", tenants,
                       *(["--log-dir", args.log_dir] if args.log_dir else []))
    try:
        records, states, clock = asyncio.run(burst(url, creds_dir, rate, args.seconds, args.input_len,
                                                   args.output_len, mix))
        doc = {"capacity_req_s": cap, "burst_req_s": rate, **vars(args), **report(records),
               "queue_intake": intake(records, states)}
    finally:
        stop_up(up)
        shutil.rmtree(creds_dir, ignore_errors=True)
    if args.log_dir:  # the logs are complete once the services stopped
        doc["first_refusal_answer"] = admission_answered(records, args.log_dir, clock)
    print(json.dumps({k: v for k, v in doc.items() if k not in ("out",)}, indent=2))
    write_result(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
