"""overload-rss: ten times the fleet's measured capacity over HTTP for --overload-s, with bad
input mixed in; every fleet process's RSS before, at peak and after, and where the requests
went, stage by stage (`stages`: every service's counters over the overload; `timeline`: the
same every TIMELINE_S, with the workers' running and waiting).

The fleet's capacity is made small enough for this 2-core machine to offer 10× of it
honestly: simulated GPUs `--overload-speed` times as fast as the profile (0.1: ten times
slower; they report the costs they run at), so the simulated GPUs, not the control plane's
CPU, bound what is served. Their clients' TPOT target scales with them (the default 100 ms ÷
speed: a tenth-speed A100 takes longer than 100 ms for one decode step). The capacity is
measured twice: before, by a closed loop of `--capacity-concurrency` streams (more than the
engine's batch fills at this length), and during the overload, as the complete 200s the fleet
answered in its second half (its saturated throughput; a stream that ended in an error frame
is `200+error`, not counted); both count only a window's second half, once the pipeline is
full. The offered load is spread over enough generator processes (generator.py) that none is
asked for more than GENERATOR_RPS, and offered ÷ capacity is reported against the larger of
the two."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
from collections import Counter

import aiohttp
from tokenyard.shared import natsutil
from tokenyard.shared.slo import DEFAULT_TPOT_SLO_MS

from bench.faults.fleet import cpu_s, fleet_for, rss_mb
from bench.faults.generator import one
from bench.faults.streams import note

GENERATOR_RPS = 60.0
"""The most one generator process is asked for (one Python process on a busy 2-core machine
keeps this rate; the earlier single generator reached 144 req/s of the 462 asked)."""
CAPACITY_S = 40.0
"""The closed loop's length; completions are counted in its second half only (a request at
these speeds takes seconds: counting from the start would undercount a loop still filling)."""
DRAIN_S = 30.0
"""After the load: how long clients wait for answers before giving up (disconnecting)."""
IDLE_WAIT_S = 120.0
TIMELINE_S = 5.0
"""How often the probe reads every service's counters during the overload (`timeline`)."""
"""How long the probe waits for the edge to hold nothing before reading RSS."""


async def edge_in_flight(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("tokenyard:edge_in_flight_requests "):
                return float(line.split()[1])
    return 0.0


async def edge_settles(base: str, within_s: float) -> tuple[float, float]:
    """Wait until the edge holds no request (at most `within_s`): what it still holds, and
    how long that took."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while (held := await edge_in_flight(http, base)) > 0 and time.monotonic() - t0 < within_s:
            await asyncio.sleep(0.5)
    return held, time.monotonic() - t0


async def closed_loop_capacity(url: str, concurrency: int, seconds: float, tpot_slo_ms: float | None = None) -> float:
    """Completions per second in the second half of a closed loop of `concurrency`."""
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        t0 = time.monotonic()

        async def loop(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() - t0 < seconds:
                if await one(http, url, i, tpot_slo_ms=tpot_slo_ms) == 200 and seconds / 2 <= time.monotonic() - t0 < seconds:
                    done += 1
                i += concurrency

        await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return done / (seconds / 2)


async def stage_counts(nats_url: str) -> dict[str, float]:
    """Every service's cumulative counters (`$SRV.STATS`), summed over its instances: `tally`."""
    nc = await natsutil.connect(nats_url, "bench-faults-stats")
    try:
        replies = await natsutil.gather_replies(nc, "$SRV.STATS", 1.0)
    finally:
        await nc.close()
    return tally(replies)


def tally(replies: list[dict]) -> dict[str, float]:
    """`$SRV.STATS` replies flat, `kind:counter:label → n` (admission decisions and refusals,
    queue dispatches, router decisions, worker finishes by reason, edge requests by outcome):
    where requests went, stage by stage. The per-request state each service holds (`kept`,
    `remembered`: bench.soak's) is not where requests went, and is left out."""
    out: Counter = Counter()
    for svc in replies:
        kind = svc["name"].removeprefix("tokenyard-")
        data = next((ep["data"] for ep in svc.get("endpoints") or [] if ep.get("data")), {})  # each endpoint repeats it
        for name, values in data.items():
            if name in ("kept", "remembered"):
                continue
            if isinstance(values, int | float):  # a gauge: a worker's running, waiting
                out[f"{kind}:{name}"] += values
            elif isinstance(values, dict):
                for label, n in values.items():
                    out[f"{kind}:{name}:{label.split(',')[-1]}"] += n
    return dict(sorted(out.items()))


def since(before: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """Counters since `before` (the overload's start: the capacity loop's requests left out);
    gauges (`worker:running`, `worker:waiting`) as they are now."""
    return {k: v if k.count(":") == 1 else v - before.get(k, 0.0) for k, v in now.items()}


async def probe_overload_rss(args) -> dict:
    fleet = fleet_for(args, workers=args.overload_workers, speed=args.overload_speed)
    await fleet.start()
    try:
        url = f"{fleet.http_url}/v1/completions"
        pids = {name: p.pid for name, p in fleet.procs}
        if fleet.server is not None and getattr(fleet.server, "proc", None) is not None:
            pids["nats-server"] = fleet.server.proc.pid
        # A GPU `speed` times as fast (workers report the costs they run at) serves clients whose TPOT
        # target scales with it: at 0.1, the default 100 ms target is below one decode step at batch 1.
        tpot_slo_ms = DEFAULT_TPOT_SLO_MS / args.overload_speed
        capacity = await closed_loop_capacity(url, args.capacity_concurrency, CAPACITY_S, tpot_slo_ms)
        note(f"overload-rss: capacity {capacity:.1f} req/s (closed loop of {args.capacity_concurrency})")
        await asyncio.sleep(3)
        base = {n: rss_mb(p) for n, p in pids.items()}
        rate = 10 * capacity
        n_gen = max(1, math.ceil(rate / GENERATOR_RPS))
        gens = [subprocess.Popen([sys.executable, "-m", "bench.faults.generator", url, str(rate / n_gen),
                                  str(args.overload_s), str(DRAIN_S), str(k + 1), str(tpot_slo_ms)],
                                 stdout=subprocess.PIPE)
                for k in range(n_gen)]
        note(f"overload-rss: {n_gen} generators × {rate / n_gen:.1f} req/s for {args.overload_s:g} s")
        t0, before = time.monotonic(), await stage_counts(fleet.nats_url)
        cpu0 = {n: cpu_s(p) for n, p in [*pids.items(), *((f"generator-{k}", g.pid) for k, g in enumerate(gens))]}
        peak, timeline, last, gen_cpu = dict(base), [], t0, {}
        while any(g.poll() is None for g in gens):
            for n, p in pids.items():
                peak[n] = max(peak[n], rss_mb(p))
            for k, g in enumerate(gens):  # a generator's last reading before it exits
                with contextlib.suppress(OSError, IndexError, ValueError):
                    gen_cpu[f"generator-{k}"] = cpu_s(g.pid) - cpu0[f"generator-{k}"]
            await asyncio.sleep(0.5)
            if time.monotonic() - last >= TIMELINE_S:
                last = time.monotonic()
                timeline.append({"t_s": round(last - t0, 1), **since(before, await stage_counts(fleet.nats_url))})
        cpu = {**{n: cpu_s(p) - cpu0[n] for n, p in pids.items()}, **gen_cpu}
        overload_wall = time.monotonic() - t0
        results = [json.loads(g.stdout.read()) for g in gens]
        stages = since(before, await stage_counts(fleet.nats_url))
        held, waited = await edge_settles(fleet.http_url, IDLE_WAIT_S)
        note(f"overload-rss: edge holds {held:g} requests {waited:.1f} s after the generators exit")
        await asyncio.sleep(5)  # idle: the edge trims after 1 s
        after = {n: rss_mb(p) for n, p in pids.items()}
        statuses: Counter = Counter()
        for r in results:
            statuses.update(r["statuses"])
        sent = sum(r["sent"] for r in results)
        offered = sum(r["offered_rps"] for r in results)
        served = sum(r["ok_second_half"] for r in results) / (args.overload_s / 2)
        per_process = {n: {"base_mb": round(base[n], 1), "peak_mb": round(peak[n], 1), "after_mb": round(after[n], 1),
                           "delta_mb": round(after[n] - base[n], 1)} for n in pids}
        ratio = None
        with contextlib.suppress(ZeroDivisionError):
            ratio = round(offered / max(capacity, served), 1)
        return {"probe": "overload-rss", "workers": args.overload_workers, "speed": args.overload_speed,
                "tpot_slo_ms": tpot_slo_ms,
                "capacity_rps": round(capacity, 1), "served_rps_under_overload": round(served, 1),
                "offered_rps": round(offered, 1), "offered_over_capacity": ratio, "generators": n_gen,
                "edge_held_after": held, "edge_settled_s": round(waited, 1),
                "sent": sent, "statuses": dict(statuses.most_common()),
                "worst_delta_mb": max(v["delta_mb"] for v in per_process.values()), "rss": per_process,
                "first_refusal_s": min((r["first_refusal_s"] for r in results if r.get("first_refusal_s") is not None),
                                       default=None),
                "refusal_s": [r.get("refusal_s") for r in results],
                "cpu_s": {n: round(v, 1) for n, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
                "cpu_wall_s": round(overload_wall, 1),
                "stages": stages, "timeline": timeline}
    finally:
        await fleet.stop()
