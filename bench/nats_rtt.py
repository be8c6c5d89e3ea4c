"""The floor under every hop: a bare NATS request/reply between two Python processes.

    python -m bench.nats_rtt [--requests 300] [--gaps-ms 0,50] [--loop uvloop|asyncio] [--json PATH]

A nats-server (open, JetStream off) and a responder process (`--loop`: uvloop, as every
service runs, or asyncio's own loop; one subscription that answers each message with its
payload) are started; this process (the same loop) sends `--requests`
requests of 200 bytes one at a time, for each gap between them (0: back to back; 50 ms: the
control-plane benchmark's pacing, every receiver idle when its message comes). Printed per
gap: the round trip's p50 / p90 / p99 (ms), and the requester's CPU per round trip (ms,
`time.process_time`), so the wall time a round trip takes beyond its CPU — waking the
nats-server and the responder, each idle — is in view. One crossing of a hop costs about half
a round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._out import write_result

SUBJECT = "bench.rtt"


async def respond(url: str) -> None:
    import nats
    from tokenyard.shared import nats_internals

    nc = await nats.connect(url)
    nats_internals.ping_after_pending(nc)  # else the flush's PING overtakes the SUB: "ready" before it is

    async def echo(msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(SUBJECT, cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def ask(url: str, n: int, gap_s: float) -> dict[str, float]:
    import nats

    nc = await nats.connect(url)
    try:
        walls, cpus = [], []
        for _ in range(n):
            t, c = time.perf_counter(), time.process_time()
            await nc.request(SUBJECT, b"x" * 200, timeout=5)
            walls.append((time.perf_counter() - t) * 1e3)
            cpus.append((time.process_time() - c) * 1e3)
            if gap_s:
                await asyncio.sleep(gap_s)
    finally:
        await nc.close()
    walls.sort()
    return {"gap_ms": gap_s * 1e3, "requests": n, "p50_ms": statistics.median(walls),
            "p90_ms": walls[int(0.9 * n)], "p99_ms": walls[min(n - 1, int(0.99 * n))],
            "cpu_ms_per_round_trip": statistics.fmean(cpus)}


async def run(args: argparse.Namespace) -> list[dict[str, float]]:
    from tokenyard.shared import natsutil

    server = await natsutil.NatsServer(port=0).start()
    responder = subprocess.Popen([sys.executable, "-m", "bench.nats_rtt", "--respond", server.url, "--loop", args.loop],
                                 stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    try:
        responder.stdout.readline()  # "ready": subscribed
        return [await ask(server.url, args.requests, gap / 1e3) for gap in args.gaps_ms]
    finally:
        responder.kill()
        responder.wait()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nats_rtt", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="round trips per gap")
    p.add_argument("--gaps-ms", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 50.0],
                   help="pauses between round trips, ms, comma-separated")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the event loop of both ends (default: uvloop, as the services run)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--respond", metavar="URL", help=argparse.SUPPRESS)  # the responder process
    args = p.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    if args.respond:
        asyncio.run(respond(args.respond))
        return 0
    import os

    load_before = os.getloadavg()
    rows = asyncio.run(run(args))
    for r in rows:
        print(f"gap {r['gap_ms']:>4.0f} ms: round trip p50 {r['p50_ms']:.3f}  p90 {r['p90_ms']:.3f}  "
              f"p99 {r['p99_ms']:.3f} ms; requester CPU {r['cpu_ms_per_round_trip']:.3f} ms a round trip")
    load = {"before": load_before, "after": os.getloadavg()}
    print(f"load average before {load['before'][0]:.2f}, after {load['after'][0]:.2f}")
    write_result(args.json, {"rows": rows, "loop": args.loop, "load_avg": load}, prog="python -m bench.nats_rtt", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
