"""What one refusal costs the edge and admission, and where it goes.

    python -m bench.refusal_cost [--rate 60] [--seconds 20] [--profile FILE]

A real nats-server; admission and the edge in this process (so one profile covers both); a
queue state published every 100 ms that predicts a P1 wait far beyond its 5 s target, so
admission refuses every good request (503, SLO feasibility, before any tokenizing); the
overload probe's HTTP generator (bench/faults/generator.py: 10 % bad bodies) as a separate
process at --rate for --seconds. Reports this process's CPU per request (user + system),
the refusal latency the generator saw (p50 / p99 / max), and, with --profile, a cProfile of
the load window (CPU time): the top functions by own time and their share grouped by package.
Logging as `tokenyard up` runs it (TOKENYARD_LOG_LEVEL, default INFO: every refusal's log line)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import resource
import subprocess
import sys
import time
from collections import Counter

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared import metrics as metrics_module
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from bench._out import write_result

GROUPS = ("tokenyard", "nats", "aiohttp", "structlog", "opentelemetry", "prometheus_client", "msgspec", "asyncio")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def saturated_queue(nc, stop: asyncio.Event) -> None:
    """A queue state every 100 ms: 10⁸ P1 work tokens draining at 1,000/s (a wait of days)."""
    while not stop.is_set():
        state = schemas.QueueStats("pq-bench", time.time(), "hybrid", [0, 1000, 0, 0], [0, 10**8, 0, 0], 0, 1000.0)
        await nc.publish(subjects.QUEUE_STATE, codec.encode(state))
        await asyncio.sleep(0.1)


def grouped(stats: pstats.Stats) -> dict[str, float]:
    """Own time per package (the file path's first known package), seconds."""
    out: Counter = Counter()
    for (path, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        group = next((g for g in GROUPS if f"/{g}/" in path or f"{g}." in path), "other")
        if group == "tokenyard" or "/wt/" in path or "/services/" in path or "/shared/" in path:
            group = "tokenyard"
        out[group] += tt
    return {k: round(v, 3) for k, v in out.most_common()}


async def run(args) -> dict:
    server = await natsutil.NatsServer().start()
    hosts = []
    stop = asyncio.Event()
    try:
        hosts.append(await ServiceHost(AdmissionShell(AdmissionConfig(), ByteTokenizer()), server.url).start())
        edge = EdgeShell(EdgeConfig(http_port=0))
        hosts.append(await ServiceHost(edge, server.url).start())
        nc = await natsutil.connect(server.url, "bench-refusal-cost")
        feeder = asyncio.create_task(saturated_queue(nc, stop))
        await asyncio.sleep(0.5)
        url = f"http://127.0.0.1:{edge.port}/v1/completions"
        gen = subprocess.Popen([sys.executable, "-m", "bench.faults.generator", url, str(args.rate), str(args.seconds),
                                "30", "1"], stdout=subprocess.PIPE)
        prof = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not wall: the host is shared
        c0, t0 = cpu_s(), time.monotonic()
        if prof:
            prof.enable()
        while gen.poll() is None:
            await asyncio.sleep(0.1)
        if prof:
            prof.disable()
        used, wall = cpu_s() - c0, time.monotonic() - t0
        result = json.loads(gen.stdout.read())
        stop.set()
        await feeder
        await nc.close()
        edge_seen = metrics_module.count_samples(edge.metrics.requests)
        answered = sum(v for k, v in result["statuses"].items() if k.isdigit())
        out = {"rate": args.rate, "seconds": args.seconds, "sent": result["sent"], "statuses": result["statuses"],
               "edge_requests": edge_seen, "cpu_s": round(used, 2), "wall_s": round(wall, 1),
               "cpu_ms_per_request": round(1000 * used / max(answered, 1), 3),
               "first_refusal_s": result.get("first_refusal_s"), "refusal_s": result.get("refusal_s")}
        if prof:
            prof.dump_stats(args.profile)
            stats = pstats.Stats(prof)
            out["own_time_by_package_s"] = grouped(stats)
            top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
            out["top_own_time"] = [f"{tt * 1000:.0f} ms  {path.split('site-packages/')[-1]}:{line} {fn}"
                                   for (path, line, fn), (_cc, _nc, tt, _ct, _c) in top]
        return out
    finally:
        stop.set()
        for h in reversed(hosts):
            await h.stop()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.refusal_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=60.0, help="requests a second the HTTP generator sends (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the generator sends, seconds (default: %(default)s)")
    ap.add_argument("--profile", default=None, help="write the cProfile here and report its top functions")
    ap.add_argument("--json", default=None, help="write the result as JSON to this file (default: not written)")
    args = ap.parse_args(argv)
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=1))
    write_result(args.json, out, "python -m bench.refusal_cost", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
