"""soak: does what the fleet keeps per request go back to its baseline once the load is over?
A real fleet as `tokenyard up` runs it (nats-server; the queue's process with the HTTP edge,
admission and the router; macro; simulated workers `--speed` times as fast as the profile, so a
request lasts milliseconds), under a steady mixed load in phases; after each phase the fleet goes
idle, and then each process's RSS and each service's per-request counts are sampled.

    python -m bench.soak [--phases 4] [--requests 2000] [--concurrency 24] [--workers 2]
                         [--speed 20] [--edge-processes 0] [--baseline REF] [--json FILE]
                         [--log-dir DIR]

`--baseline REF`: the fleet runs REF's code instead of this tree's (bench/baseline.py), for a
before/after; REF must count `kept` (a tree before that sees only RSS).

Load: each phase `--requests` seeded requests, `--concurrency` at a time, half OpenAI SSE
through the edge and half TokenyardClient over NATS, each claiming a tenant name of its own
(`user`) under a tenants file whose default policy has a rate (so admission keeps a token bucket
per name while it refills), of these kinds (MIX):

    completed     read to the end
    aborted       the client leaves after ABORT_AFTER chunks (HTTP: closes its connection;
                  NATS: leaves its `async for`, which publishes an Abort)
    refused_bad   bad input (max_tokens 0): a 400
    refused_long  a prompt longer than the model's context: a 400
    resubmitted   completed, then its id sent again: a 409 (JetStream's duplicate window)
    vanished      NATS only: a client of its own whose connection closes after ABORT_AFTER chunks
                  of each of its VANISH_GROUP streams, no Abort sent (the routers find its lease
                  gone and abort them)

Idle: after each phase, until every `kept` count (below) is back at its value before any load
(IDLE_TIMEOUT_S at most), then SETTLE_S more. Sample: VmRSS of every process; `$SRV.STATS` of
every service instance (shared/service.py): `kept`, each container that holds something per
request (0 at idle), and `remembered`, each memory bounded on purpose ([entries, bound]).

Verdict, per process: RSS growth per 1,000 requests from the sample after the first phase (which
warms caches and allocator arenas) to the last, and over each later phase alone; `grows` when
the whole exceeds GROWS_MB_PER_1K and no later phase shrank it, `memories filling` instead when
a bounded memory of that process (`process_of`) still grew (a memory grows until it is full: the
RSS with it, expected). A `kept` count not back at its baseline is named (`not_idle`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from rich import box
from rich.console import Console
from rich.table import Table
from tokenyard.shared import config, natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from bench._out import write_result
from bench.baseline import baseline_env, commit_of
from bench.faults.fleet import rss_mb
from tokenyard.launcher import FleetProcesses

MIX = {"completed": 0.55, "aborted": 0.15, "refused_bad": 0.06, "refused_long": 0.06, "resubmitted": 0.1,
       "vanished": 0.08}
ABORT_AFTER = 3
"""Chunks an aborting (or vanishing) client reads first."""
VANISH_GROUP = 8
"""Streams on one vanishing client (a connection each group, not each request)."""
TENANT_RATE = 1e7
"""The default policy's rate (tokens/s; burst twice it): never refuses, but makes a bucket per name."""
IDLE_TIMEOUT_S = 60.0
SETTLE_S = 2.0
GROWS_MB_PER_1K = 0.5
"""RSS growth per 1,000 requests past which a process `grows`. Chosen, not derived: workers whose
bounded memories account for ~0.1 MB per 1,000 stepped 0.0–0.85 between phases
(docs/results-soak.md), so one step says little. A leak of a few KB per affected request (the
router's, fixed) stays under it for thousands of requests: the `kept` counts catch that one."""


@dataclass(frozen=True)
class Planned:
    kind: str
    via: str
    """`http` or `nats`."""
    max_tokens: int


def plan(seed: int, n: int) -> list[Planned]:
    """`n` requests of MIX's kinds, seeded; vias alternate (vanished: NATS only)."""
    rng = random.Random(seed)
    kinds, weights = zip(*MIX.items(), strict=True)
    out = []
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        via = "nats" if kind == "vanished" or i % 2 else "http"
        out.append(Planned(kind, via, 400 if kind in ("aborted", "vanished") else rng.randint(8, 64)))
    return out


def flat(stats: list[dict]) -> tuple[dict[str, int], dict[str, list]]:
    """`$SRV.STATS` replies → (`service.count` → n for every `kept` count, `service.memory` →
    [entries, bound] for every `remembered`); a service by its kind, a worker by its id."""
    kept: dict[str, int] = {}
    remembered: dict[str, list] = {}
    for svc in stats:
        kind = svc["name"].removeprefix("tokenyard-")
        who = (svc.get("metadata") or {}).get("instance", "") if kind == "worker" else kind
        data = next((ep["data"] for ep in svc.get("endpoints") or [] if ep.get("data")), {})
        for name, n in (data.get("kept") or {}).items():
            kept[f"{who}.{name}"] = kept.get(f"{who}.{name}", 0) + n
        for name, (n, bound) in (data.get("remembered") or {}).items():
            remembered[f"{who}.{name}"] = [n, bound]
    return dict(sorted(kept.items())), dict(sorted(remembered.items()))


def not_idle(baseline: dict[str, int], kept: dict[str, int]) -> dict[str, list[int]]:
    """The counts not back at their baseline: name → [baseline, now]."""
    return {k: [baseline.get(k, 0), v] for k, v in kept.items() if v != baseline.get(k, 0)}


def process_of(count: str, edge_processes: int = 0) -> str:
    """The fleet process a `service.count` belongs to, as `tokenyard up` lays them out: the
    queue's holds the router, admission and (without edge processes) the edge; worker wN is
    `worker-N` (FleetProcesses' ids)."""
    who = count.split(".")[0]
    if who in ("queue", "router", "admission") or (who == "edge" and not edge_processes):
        return "queue"
    if who[:1] == "w" and who[1:].isdigit():
        return f"worker-{who[1:]}"
    return who


def growth(values: list[float], per_phase: int) -> dict[str, Any]:
    """`values`: one sample after each phase. Growth per 1,000 requests from the first sample to
    the last (`per_1k`) and over each later phase (`phases`), and the verdict."""
    steps = [(b - a) * 1000 / per_phase for a, b in zip(values, values[1:], strict=False)]
    total = (values[-1] - values[0]) * 1000 / (per_phase * (len(values) - 1)) if len(values) > 1 else 0.0
    grows = len(steps) > 0 and total > GROWS_MB_PER_1K and min(steps) >= 0
    return {"per_1k": round(total, 3), "phases": [round(s, 3) for s in steps], "grows": grows}


def verdict(samples: list[dict[str, Any]], per_phase: int, edge_processes: int = 0) -> dict[str, Any]:
    """The soak's verdict from its samples, one after each phase (the first, a warm-up, left out
    of the growth): RSS growth per process, memories' growth, the counts not back at idle."""
    later = samples[1:] if len(samples) > 1 else samples
    rss = {p: growth([s["rss_mb"][p] for s in later], per_phase) for p in later[0]["rss_mb"]}
    memories = {m: {**growth([s["remembered"].get(m, [0, None])[0] for s in later], per_phase),
                    "bound": later[-1]["remembered"][m][1]} for m in later[-1]["remembered"]}
    for m in memories.values():
        m["grows"] = m["per_1k"] > 0
    for p, g in rss.items():
        g["filling"] = sorted(m for m, v in memories.items() if v["grows"] and process_of(m, edge_processes) == p)
    left = {s["phase"]: s["not_idle"] for s in samples if s["not_idle"]}
    return {"rss": rss, "remembered": memories, "not_idle": left,
            "growing": sorted(p for p, g in rss.items() if g["grows"] and not g["filling"]),
            "kept_not_back": sorted({k for v in left.values() for k in v})}


class Soak:
    def __init__(self, args) -> None:
        self.args = args
        self.tally: Counter = Counter()

    async def run(self) -> dict[str, Any]:
        args = self.args
        with tempfile.TemporaryDirectory(prefix="tokenyard-soak-") as tmp:
            tenants = os.path.join(tmp, "tenants.toml")
            with open(tenants, "w") as f:
                f.write(f"[default]\nrate = {TENANT_RATE:g}\n")
            with contextlib.ExitStack() as stack:
                env = stack.enter_context(baseline_env(args.baseline)) if args.baseline else {}
                fleet = FleetProcesses(workers=args.workers, speed=args.speed, http_port=0, log_dir=args.log_dir,
                                       edge_processes=args.edge_processes, tenants=tenants, extra_env=env)
                async with fleet:
                    return await self._soak(fleet)

    async def _soak(self, fleet: FleetProcesses) -> dict[str, Any]:
        args = self.args
        self.fleet = fleet
        self.pids = {"nats-server": fleet.server.proc.pid, **{n: p.pid for n, p in fleet.procs}}
        self.nc = await natsutil.connect(fleet.nats_url, "bench-soak")
        self.client = TokenyardClient(await natsutil.connect(fleet.nats_url, "bench-soak-client"))
        conn = aiohttp.TCPConnector(limit=0)
        samples: list[dict[str, Any]] = []
        try:
            async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
                self.http = http
                await asyncio.sleep(SETTLE_S)
                self.baseline, _ = flat(await natsutil.gather_replies(self.nc, "$SRV.STATS", 1.0))
                samples.append(await self._sample("idle", 0.0, 0.0))
                for phase in range(1, args.phases + 1):
                    t0 = time.monotonic()
                    await self._phase(plan(args.seed * 1000 + phase, args.requests), phase)
                    load_s = time.monotonic() - t0
                    idle_s = await self._idle()
                    samples.append(await self._sample(phase, load_s, idle_s))
                    print(f"phase {phase}: {args.requests} requests in {load_s:.1f} s, idle after {idle_s:.1f} s; "
                          f"RSS {samples[-1]['rss_mb']}", file=sys.stderr, flush=True)
        finally:
            await self.client.close()
            await self.client.nc.drain()
            await self.nc.drain()
        code = commit_of(args.baseline) if args.baseline else "this tree"
        return {"config": {k: v for k, v in vars(args).items() if k not in ("func", "json", "log_dir")}, "code": code,
                "mix": MIX, "tally": dict(sorted(self.tally.items())), "baseline": self.baseline,
                "samples": samples, "verdict": verdict(samples[1:], args.requests, args.edge_processes)}

    async def _sample(self, phase, load_s: float, idle_s: float) -> dict[str, Any]:
        kept, remembered = flat(await natsutil.gather_replies(self.nc, "$SRV.STATS", 1.0))
        return {"phase": phase, "load_s": round(load_s, 1), "idle_after_s": round(idle_s, 1),
                "rss_mb": {p: round(rss_mb(pid), 1) for p, pid in self.pids.items()},
                "kept": kept, "remembered": remembered, "not_idle": not_idle(self.baseline, kept)}

    async def _idle(self) -> float:
        """Seconds until every `kept` count is back at its baseline (IDLE_TIMEOUT_S at most), then SETTLE_S."""
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                while not_idle(self.baseline, flat(await natsutil.gather_replies(self.nc, "$SRV.STATS", 0.5))[0]):
                    await asyncio.sleep(0.5)
        took = time.monotonic() - t0
        await asyncio.sleep(SETTLE_S)
        return took

    async def _phase(self, planned: list[Planned], phase: int) -> None:
        sem = asyncio.Semaphore(self.args.concurrency)
        vanish = [p for p in planned if p.kind == "vanished"]
        groups = [vanish[i:i + VANISH_GROUP] for i in range(0, len(vanish), VANISH_GROUP)]

        async def one(p: Planned, i: int) -> None:
            async with sem:
                user = f"soak-{phase}-{i}"
                await (self._http(p, user) if p.via == "http" else self._nats(p, user))

        async def group(g: list[Planned]) -> None:
            async with sem:
                await self._vanish(g, phase)

        await asyncio.gather(*(one(p, i) for i, p in enumerate(planned) if p.kind != "vanished"),
                             *(group(g) for g in groups))

    def _request(self, p: Planned, user: str, rid: str | None = None) -> schemas.GenerateRequest:
        prompt = "z" * (config.MAX_MODEL_LEN + 1) if p.kind == "refused_long" else f"soak {user} " * 4
        return schemas.GenerateRequest(prompt=prompt, max_tokens=0 if p.kind == "refused_bad" else p.max_tokens,
                                       request_id=rid or uuid.uuid4().hex, ignore_eos=True, user=user)

    async def _nats(self, p: Planned, user: str) -> None:
        req = self._request(p, user)
        for attempt in (1, 2) if p.kind == "resubmitted" else (1,):
            end, chunks = "none", 0
            async for e in self.client.stream(req):
                chunks += isinstance(e, schemas.Chunk)
                if p.kind == "aborted" and chunks >= ABORT_AFTER:
                    end = "left"
                    break
                end = _end(e)
            self.tally[f"{p.kind} nats{' again' if attempt == 2 else ''}: {end}"] += 1

    async def _http(self, p: Planned, user: str) -> None:
        body = {"model": self.fleet.model, "prompt": self._request(p, user).prompt, "stream": True,
                "max_tokens": 0 if p.kind == "refused_bad" else p.max_tokens, "ignore_eos": True, "user": user}
        headers = {"x-request-id": uuid.uuid4().hex}
        for attempt in (1, 2) if p.kind == "resubmitted" else (1,):
            end = "none"
            try:
                async with self.http.post(f"{self.fleet.http_url}/v1/completions", json=body, headers=headers) as r:
                    if r.status != 200:
                        await r.read()
                        end = str(r.status)
                    else:
                        frames = 0
                        async for raw in r.content.iter_any():
                            frames += raw.count(b"data: ")
                            if p.kind == "aborted" and frames >= ABORT_AFTER:
                                r.close()  # the edge sees its client go: it aborts the request
                                end = "left"
                                break
                        else:
                            end = "200"
            except aiohttp.ClientError as e:
                end = f"client error {type(e).__name__}"
            self.tally[f"{p.kind} http{' again' if attempt == 2 else ''}: {end}"] += 1

    async def _vanish(self, group: list[Planned], phase: int) -> None:
        """A client of its own whose connection closes under its streams: no Abort goes out."""
        client = TokenyardClient(await natsutil.connect(self.fleet.nats_url, "bench-soak-vanishing"))
        read = [asyncio.Event() for _ in group]

        async def reader(p: Planned, ready: asyncio.Event, i: int) -> None:
            chunks = 0
            async for e in client.stream(self._request(p, f"soak-{phase}-v{i}")):
                chunks += isinstance(e, schemas.Chunk)
                if chunks >= ABORT_AFTER or isinstance(e, schemas.TERMINAL_EVENTS):
                    ready.set()

        tasks = [asyncio.create_task(reader(p, ev, i)) for i, (p, ev) in enumerate(zip(group, read, strict=True))]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.gather(*(ev.wait() for ev in read))
        await client.nc.close()  # gone: no Abort can go out
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()  # its lease task and inboxes (the connection is closed already)
        self.tally["vanished nats: left"] += len(group)


def _end(e: schemas.StreamEvent) -> str:
    if isinstance(e, schemas.Rejected | schemas.Error):
        return f"{type(e).__name__.lower()} {e.status}"
    return type(e).__name__.lower()


def print_report(doc: dict[str, Any], console: Console) -> None:
    samples = [s for s in doc["samples"] if s["phase"] != "idle"]
    v = doc["verdict"]
    t = Table(title=f"RSS (MB) after each phase of {doc['config']['requests']} requests, growth per 1,000 "
                    f"requests after phase 1 (grows: over {GROWS_MB_PER_1K} and never shrinking; memories "
                    "filling: so did one of its bounded memories)",
              box=box.SIMPLE_HEAD)
    for col in ("process", "idle", *(f"after {s['phase']}" for s in samples), "MB / 1k", "per later phase", "verdict"):
        t.add_column(col, justify="left" if col in ("process", "verdict") else "right")
    idle = doc["samples"][0]["rss_mb"]
    for p, g in v["rss"].items():
        t.add_row(p, f"{idle[p]:.1f}", *(f"{s['rss_mb'][p]:.1f}" for s in samples), f"{g['per_1k']:.2f}",
                  " ".join(f"{x:.2f}" for x in g["phases"]),
                  "flat" if not g["grows"] else "memories filling" if g["filling"] else "grows")
    console.print(t)
    t = Table(title="Bounded memories: entries after each phase, growth per 1,000 requests", box=box.SIMPLE_HEAD)
    for col in ("memory", *(f"after {s['phase']}" for s in samples), "per 1k", "bound"):
        t.add_column(col, justify="left" if col == "memory" else "right")
    for m, g in v["remembered"].items():
        t.add_row(m, *(str(s["remembered"].get(m, [0])[0]) for s in samples), f"{g['per_1k']:.0f}",
                  "time" if g["bound"] is None else str(g["bound"]))
    console.print(t)
    if v["not_idle"]:
        for phase, counts in v["not_idle"].items():
            console.print(f"after phase {phase}, not back at baseline: {counts}")
    else:
        console.print(f"every per-request count back at its baseline after every phase ({len(doc['baseline'])} counts)")
    console.print("requests: " + ", ".join(f"{k} {n}" for k, n in doc["tally"].items()))


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", type=int, default=4, help="load phases, each followed by idle and a sample (default: 4)")
    p.add_argument("--requests", type=int, default=2000, help="requests per phase (default: 2000)")
    p.add_argument("--concurrency", type=int, default=24, help="requests in flight at once (default: 24)")
    p.add_argument("--workers", type=int, default=2, help="simulated workers (default: 2)")
    p.add_argument("--speed", type=float, default=20.0, help="the workers' --speed (default: 20: short requests)")
    p.add_argument("--edge-processes", type=int, default=0, choices=(0, 1),
                   help="0: the edge in the queue's process (up's default); 1: an edge process of its own")
    p.add_argument("--seed", type=int, default=1, help="the load's seed (default: 1)")
    p.add_argument("--baseline", default=None, help="run the fleet on this commit's code instead (a before)")
    p.add_argument("--log-dir", default=None, help="the fleet's process logs (default: none kept)")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args()
    if args.phases < 3:
        p.error("--phases must be at least 3: growth is measured between the phases after the first")
    doc = asyncio.run(Soak(args).run())
    print_report(doc, Console(width=150))
    write_result(args.json, doc, prog="python -m bench.soak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
