"""`tokenyard top --nats URL [--once]`: a live terminal view of a fleet, from NATS alone.

Each round (every `--interval`, 1 s) it gathers:
  * every service instance: `$SRV.STATS` (nats.micro: name, instance, version, start time, per
    endpoint requests / errors / processing time, and the `data` each service's metrics put
    there — shared/metrics.py `snapshot()`);
  * every worker's latest heartbeat (`llm.v1.hb.*`: running, waiting, KV use, P, BS, phase);
  * the priority queue's state (`llm.v1.pq.state`: depth by class).
Rates are the difference of two rounds' counters over the time between them: requests/s
(admission verdicts), refusals/s by reason, routed/s, finished/s (workers). `--once` takes
two rounds one interval apart and prints one snapshot.

`Sample` and `render` are pure (a round's data in, a rich renderable out), so tests build
samples by hand as well as from a live fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tokenyard.shared import codec, config, nats_auth, natsutil, schemas, subjects


@dataclass
class Sample:
    """What one round saw."""

    at: float
    services: list[dict] = field(default_factory=list)
    """`$SRV.STATS` replies, one per service instance."""
    heartbeats: dict[str, schemas.Heartbeat] = field(default_factory=dict)
    queue: schemas.QueueStats | None = None

    def counters(self) -> Counter:
        """Fleet-wide cumulative counters, summed over service instances."""
        out: Counter = Counter()
        for svc in self.services:
            kind = svc["name"].removeprefix("tokenyard-")
            # nats.micro repeats a service's stats on each of its endpoints (a worker has three): once
            data = next((ep["data"] for ep in svc.get("endpoints") or [] if ep.get("data")), {})
            if kind == "admission":
                for outcome, n in (data.get("decisions") or {}).items():
                    out["requests"] += n
                    out[f"admission:{outcome}"] += n
                for reason, n in (data.get("refusals") or {}).items():
                    out[f"refused:{reason}"] += n
            elif kind == "router":
                for labels, n in (data.get("decisions") or {}).items():
                    out[f"router:{labels.rsplit(',', 1)[-1]}"] += n
            elif kind == "worker":
                out["finished"] += sum((data.get("finished") or {}).values())
        return out


def rates(prev: Sample | None, cur: Sample) -> dict[str, float]:
    """Per-second rate of every counter between two rounds (empty on the first round)."""
    if prev is None or cur.at <= prev.at:
        return {}
    dt = cur.at - prev.at
    a, b = prev.counters(), cur.counters()
    return {k: max(0.0, b[k] - a[k]) / dt for k in b}


def render(cur: Sample, prev: Sample | None = None) -> Group:
    r = rates(prev, cur)
    refused = {k.removeprefix("refused:"): v for k, v in r.items() if k.startswith("refused:")}
    head = Text.assemble(
        ("tokenyard top", "bold"), f"  {time.strftime('%H:%M:%S', time.localtime(cur.at))}   ",
        f"requests {r.get('requests', 0.0):.1f}/s   routed {r.get('router:routed', 0.0):.1f}/s   "
        f"finished {r.get('finished', 0.0):.1f}/s   refused {sum(refused.values()):.1f}/s",
        (("  (" + ", ".join(f"{k} {v:.1f}/s" for k, v in sorted(refused.items()) if v) + ")") if any(
            refused.values()) else ""),
    )

    # Headers short and cells padded by one space so the tables fit a plain 80-column terminal.
    services = Table(title="services ($SRV.STATS)", title_justify="left", padding=(0, 1), show_edge=False)
    for col in ("service", "instance", "version", "endpoint", "calls", "errors", "avg ms"):
        services.add_column(col, justify="right" if col in ("calls", "errors", "avg ms") else "left",
                            no_wrap=col in ("service", "instance"))
    for svc in sorted(cur.services, key=lambda s: (s["name"], (s.get("metadata") or {}).get("instance", ""))):
        instance = (svc.get("metadata") or {}).get("instance", svc.get("id", ""))
        for ep in svc.get("endpoints") or [{}]:
            services.add_row(svc["name"].removeprefix("tokenyard-"), instance, svc.get("version", ""),
                             ep.get("name", ""), str(ep.get("num_requests", 0)), str(ep.get("num_errors", 0)),
                             f"{ep.get('average_processing_time', 0) / 1e6:.2f}")

    # The macro and phase columns only where some worker has one (a plain fleet: no macro, all mixed).
    hbs = sorted(cur.heartbeats.items())
    show_macro = any(hb.macro_id for _, hb in hbs)
    show_phase = any(str(hb.phase) != str(schemas.Phase.MIXED) for _, hb in hbs)
    workers = Table(title="workers (heartbeats; P tok: prefill tokens queued; age in s)",
                    title_justify="left", padding=(0, 1), show_edge=False)
    cols = ("worker", "engine", *(("macro",) if show_macro else ()), *(("phase",) if show_phase else ()),
            "run", "wait", "P tok", "KV", "hit", "preempt", "age")
    for col in cols:
        workers.add_column(col, justify="left" if col in ("worker", "engine", "macro", "phase") else "right",
                           no_wrap=col == "worker")
    for wid, hb in hbs:
        s = hb.stats
        total = s.kv_blocks_used + s.kv_blocks_free
        hit = s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0
        state = "draining" if hb.draining else ("" if hb.healthy else "unhealthy")
        workers.add_row(wid + (f" ({state})" if state else ""), hb.engine,
                        *((hb.macro_id or "-",) if show_macro else ()), *((str(hb.phase),) if show_phase else ()),
                        str(s.running), str(s.waiting), str(s.queued_prefill_tokens),
                        f"{s.kv_blocks_used / total:.1%}" if total else "-", f"{hit:.0%}", str(s.preemptions),
                        f"{max(0.0, cur.at - hb.ts):.1f}")

    queue = Table(title="priority queue (depth by class)", title_justify="left", padding=(0, 1), show_edge=False)
    classes = [f"P{c.value}" for c in schemas.PriorityClass]
    for col in ("policy", *classes, "in flight", "drain req/s"):
        queue.add_column(col, justify="left" if col == "policy" else "right")
    if cur.queue is not None:
        q = cur.queue
        # the drain is measured only out of a backlog (QueueCore.drain_rate): "-" until one is held
        drain = f"{q.drain_requests_per_s:.1f}" if q.drain_measured else "-"
        queue.add_row(q.policy, *map(str, q.depth), str(q.in_flight), drain)
    return Group(head, services, workers, queue)


class Watcher:
    """Keeps the latest heartbeats and queue state from subscriptions; `sample()` adds the
    `$SRV.STATS` round."""

    def __init__(self, nc, stats_wait_s: float = 0.3):
        self.nc = nc
        self.stats_wait_s = stats_wait_s
        self.heartbeats: dict[str, schemas.Heartbeat] = {}
        self.queue: schemas.QueueStats | None = None

    async def start(self) -> Watcher:
        await self.nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        await self.nc.subscribe(subjects.QUEUE_STATE, cb=self._on_queue)
        return self

    async def _on_heartbeat(self, msg) -> None:
        with contextlib.suppress(codec.DecodeError):
            hb = codec.decode(msg.data, schemas.Heartbeat)
            self.heartbeats[hb.worker_id] = hb

    async def _on_queue(self, msg) -> None:
        with contextlib.suppress(codec.DecodeError):
            self.queue = codec.decode(msg.data, schemas.QueueStats)

    async def sample(self) -> Sample:
        services = await natsutil.gather_replies(self.nc, "$SRV.STATS", self.stats_wait_s)
        now = time.time()
        # A worker that stopped heartbeating for long is gone: the router forgets it after 60 s.
        live = {w: hb for w, hb in self.heartbeats.items() if now - hb.ts < 60.0}
        return Sample(now, services, live, self.queue)


async def run(url: str, once: bool, interval_s: float, console: Console, svg: str | None = None) -> int:
    nc = await natsutil.connect(url, "tokenyard-top", kind=nats_auth.OBSERVER)
    try:
        watcher = await Watcher(nc).start()
        prev = await watcher.sample()
        await asyncio.sleep(interval_s)
        cur = await watcher.sample()
        if once:
            console.print(render(cur, prev))
            if svg:
                console.save_svg(svg, title="tokenyard top")
            return 0
        from rich.live import Live

        with Live(render(cur, prev), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                prev, cur = cur, await watcher.sample()
                live.update(render(cur, prev))
    finally:
        await nc.drain()


def register(sub) -> None:
    p = sub.add_parser("top", help="live terminal view of a running fleet (services, workers, queue, rates)")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS URL(s), comma-separated")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--svg", metavar="FILE", help="with --once: also save the snapshot as an SVG picture")
    p.set_defaults(func=main)


def main(args) -> int:
    try:
        console = Console(record=bool(args.svg))
        return asyncio.run(run(args.nats, args.once, args.interval, console, args.svg if args.once else None))
    except KeyboardInterrupt:
        return 0
    except (OSError, KeyError) as e:  # cannot reach NATS, credentials refused or missing: a line, not a traceback
        print(f"tokenyard top: error: {e}", file=sys.stderr)
        return 1
