"""chaos: a fleet as `tokenyard up` runs it plus a standby queue process started the same way,
under a steady mixed load, while one process after another is broken at seeded random times.
Two layouts (`--layout`):

  in-queue (up's default) the queue process holds the HTTP edge, admission and the router; the
          standby is a second such front on the same HTTP port (SO_REUSEPORT), so the kernel
          spreads the HTTP clients over both and, after one's death, sends new ones to the other
  apart   (`up --edge-processes 2`) the queue process holds admission and the router, 2 edge
          processes of their own under the edge's supervisor

    worker  SIGKILL one worker                   (migration moves its streams)
    edge    apart: SIGKILL one edge process      (its HTTP clients see an error; restarted)
            in-queue: SIGKILL the standby front  (edge, admission, queue, router: its HTTP clients
                                                  see an error, its NATS clients' requests go on)
    queue   SIGKILL the fleet's queue process    (the standby's admission, queue and router go on;
                                                  what it held comes back after the 30 s ack wait;
                                                  in-queue: the fleet's front with it)
    nats    stop the nats-server for NATS_DOWN_S, start it again on the same port and store

In the in-queue layout a killed front is started again at once (the part the edge's supervisor
plays for edge processes), so a survivor serves while the next fault falls.

`schedule(seed, load_s)`: the faults in a seeded order, each at a seeded time in the first half
of its own window of the load (the second half is its recovery); a fault fires only once the
fleet answers again after the one before (every service in its count answering `$SRV.PING`),
so one fault at a time. The load (`plan(seed, load_s, rate)`): requests at a steady rate, half
OpenAI SSE through the edge, half TokenyardClient over NATS, a seeded class (no tier, P1, P2,
P3), length, and for ABORT_SHARE of them a client abort after a few tokens (an HTTP client
closing its connection; a NATS client cancelling its reader, or leaving its `async for`).

The NATS half is also counted on the wire, before TokenyardClient repairs it (`WireCount`): a
seq that came twice (the client drops it) and the generations a stream had (a chunk naming its
worker opens one): more generations than the worker kill and the client's resumes account for
is a request placed twice, which the client's tally alone cannot show.

Each request is tallied once: completed (every token, one end) · failed_clean (an error or
refusal the client saw, with its reason) · aborted (the client's own abort) · lost (accepted,
then ended only by the client's own watchdog — no event for 60 s, or events lost while NATS
reconnected — or never) · hung (no terminal event by the deadline) · duplicated (tokens a
client was given twice) · left_running (a client-aborted request still running on a worker
ABANDON_CHECK_S after the abort: a generation nobody reads).

    python -m bench.faults --probe chaos [--chaos-seed 1] [--chaos-s 90] [--chaos-rate 6]
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import aiohttp
from tokenyard.loadgen.sse import SSEReader
from tokenyard.shared import codec, natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from bench.faults.fleet import RestartableNats, fleet_for, proc, queue_replica, running_on, stop_process
from bench.faults.kills import log_file
from bench.faults.streams import HttpStream, Stream, note
from tokenyard.launcher import ping

FAULTS = ("worker", "edge", "queue", "nats")
LEAD_S = 6.0
"""Load before the first fault's window."""
NATS_DOWN_S = 3.0
ABORT_SHARE = 0.1
CLASSES = (None, "P1", "P2", "P3")
WORKERS = 3
EDGES = 2
ABANDON_CHECK_S = 3.0
"""An aborted request still running on a worker this long after its client's abort was left running."""
LOST_MESSAGES = ("no event for", "events lost while NATS reconnected", "stream lost chunks", "no answer within")
"""What a client's own watchdog says: the fleet never ended the stream, or dropped its events."""
DRAIN_S = 75.0
"""After the load: streams still open then are hung (past the clients' 60 s idle watchdog)."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str


@dataclass(frozen=True)
class Planned:
    at_s: float
    via: str
    """`http` or `nats`."""
    tier: str | None
    max_tokens: int
    abort_after: int
    """Chunks read before the client aborts; 0: never."""
    how: str = ""
    """A NATS client's abort: `cancel` (its reader task) or `leave` (out of its `async for`)."""


class WireCount(TokenyardClient):
    """A TokenyardClient that also counts, per stream, what reached its inbox on the wire: the
    seqs that came again (`repeats`, with when the first and the last came) and the chunks that
    named a worker (`generations`: when, which worker, from which seq; the first chunk of a
    placement, of a migration's re-issue or of a resume; the same chunk sent again by a worker's
    replay after a NATS outage is a repeat, not another generation)."""

    def __init__(self, nc) -> None:
        super().__init__(nc)
        self.repeats: dict[str, list[float]] = {}
        """request id → [count, first, last] (time.monotonic)."""
        self.generations: dict[str, list[tuple[float, str, int]]] = {}
        self._seen: dict[str, set[int]] = {}

    def _deliver(self, msg) -> None:
        box = self._inboxes.get(msg.subject)
        if box is not None and msg.data:  # (no admission in this process: every message came over NATS)
            with contextlib.suppress(Exception):
                e = codec.decode_event(msg.data, msg.headers)
                if type(e) is schemas.Chunk:
                    now = time.monotonic()
                    seen = self._seen.setdefault(box.request_id, set())
                    if e.seq in seen:
                        r = self.repeats.setdefault(box.request_id, [0, now, now])
                        r[0], r[2] = r[0] + 1, now
                    seen.add(e.seq)
                    gens = self.generations.setdefault(box.request_id, [])
                    if e.worker_id and all((w, q) != (e.worker_id, e.seq) for _, w, q in gens):  # not a replay
                        gens.append((now, e.worker_id, e.seq))
        super()._deliver(msg)


def schedule(seed: int, load_s: float) -> list[Fault]:
    rng = random.Random(seed)
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    window = (load_s - LEAD_S) / len(kinds)
    if window < 10:
        raise ValueError(f"--chaos-s {load_s:g} leaves {window:.1f} s a fault; at least {LEAD_S + 40:g} s")
    return [Fault(round(LEAD_S + i * window + rng.uniform(0, window / 2), 2), k) for i, k in enumerate(kinds)]


def plan(seed: int, load_s: float, rate: float) -> list[Planned]:
    rng = random.Random(seed * 7919 + 1)
    out = []
    for i in range(int(load_s * rate)):
        abort = rng.random() < ABORT_SHARE
        via = "http" if i % 2 else "nats"
        tier, tokens = rng.choice(CLASSES), rng.randint(400, 800) if abort else rng.randint(16, 160)
        after = rng.randint(2, 10) if abort else 0
        how = rng.choice(("cancel", "leave")) if abort else ""  # drawn for HTTP too: the same draws as round 9's first runs
        out.append(Planned(round(i / rate, 3), via, tier, tokens, after, how if via == "nats" else ""))
    return out


class Chaos:
    def __init__(self, args) -> None:
        self.args = args
        self.seed = args.chaos_seed
        self.rng = random.Random(self.seed * 31 + 7)
        self.streams: list[tuple[Planned, Stream]] = []
        self.aborted_at: dict[str, float] = {}
        self.left_running: set[str] = set()
        self.tasks: set[asyncio.Task] = set()
        self.faults: list[dict] = []
        self.standby = None
        self.restarted: list = []
        """In-queue layout: fronts started in a killed fleet queue's place."""
        self.killed_workers: set[str] = set()

    async def run(self, env: dict[str, str]) -> dict:
        args = self.args
        self.server = RestartableNats()
        await self.server.start()
        self.in_queue = layout(args) == "in-queue"
        self.fleet = fleet_for(args, workers=WORKERS, nats_url=self.server.url,
                               edge_processes=0 if self.in_queue else EDGES, extra_env=env)
        await self.fleet.start()
        self.env = env
        try:
            self.standby = queue_replica(self.fleet, log_file(args, "queue-standby"), env)
            self.nc = await natsutil.connect(self.server.url, "bench-chaos")
            self.client = WireCount(await natsutil.connect(self.server.url, "bench-chaos-client"))
            async with asyncio.timeout(60):
                while not await self._answering():
                    await asyncio.sleep(0.2)
            conn = aiohttp.TCPConnector(force_close=True, limit=0)  # a connection each: both edge processes serve
            async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
                self.http = http
                t0 = self.t0 = time.monotonic()
                load = asyncio.create_task(self._load(t0))
                for fault in schedule(self.seed, args.chaos_s):
                    await self._at(t0, fault.at_s)
                    await self._break(fault, t0)
                await load
                await self._drain(DRAIN_S)
                for task in self.tasks:  # what is open now is hung or lost: no waiting out a 600 s timeout
                    task.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)
                row = self._tally(time.monotonic() - t0)
            await self.client.close()
            await self.client.nc.drain()
            await self.nc.drain()
            return row
        finally:
            for p in (self.standby, *self.restarted):
                await stop_process(p, 20.0)
            await self.fleet.stop()
            self.server.stop()

    async def _at(self, t0: float, at_s: float) -> None:
        await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))

    def _expected(self) -> Counter:
        want = self.fleet.expected()
        want["tokenyard-worker"] = WORKERS - len(self.killed_workers)
        for kind in ("queue", "router", "admission", *(("edge",) if self.in_queue else ())):
            want[f"tokenyard-{kind}"] = 1  # the survivor at least (two while the standby runs beside it)
        return want

    async def _answering(self) -> bool:
        if not self.nc.is_connected:
            return False
        have = await ping(self.nc)
        return all(have[k] >= v for k, v in self._expected().items())

    async def _break(self, fault: Fault, t0: float) -> None:
        waited = time.monotonic()
        async with asyncio.timeout(90):  # one fault at a time: the fleet answers again first
            while not await self._answering():
                await asyncio.sleep(0.2)
        at = time.monotonic()
        record = {"kind": fault.kind, "planned_s": fault.at_s, "at_s": round(at - t0, 2),
                  "waited_for_recovery_s": round(at - waited, 2)}
        match fault.kind:
            case "worker":
                i = self.rng.randrange(WORKERS)
                record["victim"] = f"worker-{i}"
                with contextlib.suppress(Exception):
                    record["running_on_it"] = len(await running_on(self.nc, f"w{i}"))
                proc(self.fleet, f"worker-{i}").send_signal(signal.SIGKILL)
                self.killed_workers.add(f"worker-{i}")
            case "edge" if self.in_queue:  # the standby front, started again at once
                i = self.rng.randrange(EDGES)  # drawn as in the other layout: the same draws after it
                record["victim"] = "standby front"
                self.standby.send_signal(signal.SIGKILL)
                while self.standby.poll() is None:  # its port and subscriptions gone before the next
                    await asyncio.sleep(0.02)
                self.standby = queue_replica(self.fleet, log_file(self.args, "queue-standby"), self.env)
            case "edge":
                i = self.rng.randrange(EDGES)
                record["victim"] = f"edge-{i}"
                proc(self.fleet, f"edge-{i}").send_signal(signal.SIGKILL)
            case "queue":
                record["victim"] = "queue"
                proc(self.fleet, "queue").send_signal(signal.SIGKILL)
                if self.in_queue:  # the fleet's front: another in its place, as the standby was
                    self.restarted.append(queue_replica(self.fleet, log_file(self.args, "queue-restarted"), self.env))
            case "nats":
                self.server.stop()
                await asyncio.sleep(NATS_DOWN_S)
                await self.server.start()
        note(f"chaos: {fault.kind} at {record['at_s']} s")
        await asyncio.sleep(1.0)  # the fault takes hold before recovery is judged
        async with asyncio.timeout(120):
            while not await self._answering():
                await asyncio.sleep(0.2)
        record["answering_again_s"] = round(time.monotonic() - at, 2)
        self.faults.append(record)

    async def _load(self, t0: float) -> None:
        for p in plan(self.seed, self.args.chaos_s, self.args.chaos_rate):
            await self._at(t0, p.at_s)
            task = asyncio.create_task(self._http(p) if p.via == "http" else self._nats(p))
            self.tasks.add(task)

    async def _nats(self, p: Planned) -> None:
        s = Stream(uuid.uuid4().hex, p.max_tokens)
        self.streams.append((p, s))
        req = schemas.GenerateRequest(prompt=f"chaos {s.request_id} " * 8, max_tokens=p.max_tokens,
                                      request_id=s.request_id, ignore_eos=True)
        headers = {"x-request-tier": p.tier} if p.tier else None

        async def read() -> None:
            chunks = 0
            async for e in self.client.stream(req, headers=headers):
                s.on_event(e)
                chunks += isinstance(e, schemas.Chunk)
                if p.abort_after and chunks >= p.abort_after and not s.terminal:
                    if p.how == "leave":
                        self._aborted(s)
                        break
                    # cancelled on the loop's next turn: where a reader waits, for its next event
                    asyncio.get_running_loop().call_soon(reader.cancel)
                    self._aborted(s)

        reader = asyncio.create_task(read())
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await self._check_left_running(s)

    async def _http(self, p: Planned) -> None:
        s = HttpStream(uuid.uuid4().hex, p.max_tokens)
        self.streams.append((p, s))
        body = {"model": self.fleet.model, "prompt": f"chaos {s.request_id} " * 8, "max_tokens": p.max_tokens,
                "ignore_eos": True, "stream": True}
        headers = {"x-request-id": s.request_id, **({"x-request-tier": p.tier} if p.tier else {})}
        try:
            async with self.http.post(f"{self.fleet.http_url}/v1/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    s.end("rejected", r.status)
                    s.message = (await r.text())[:120]
                    return
                s.accepted = True
                reader = SSEReader()
                async for raw in r.content.iter_any():
                    for payload in reader.feed(raw):
                        s.on_payload(payload)
                    if p.abort_after and s.tokens >= p.abort_after and not s.terminal:
                        self._aborted(s)
                        r.close()  # the edge sees the connection go and aborts the request
                        break
                else:
                    for payload in reader.close():
                        s.on_payload(payload)
        except (aiohttp.ClientError, ValueError) as e:
            if not s.terminal:
                s.end("error", 0)
                s.message = f"client: {e!r}"
        await self._check_left_running(s)

    def _aborted(self, s: Stream) -> None:
        s.end("aborted", 0)
        self.aborted_at[s.request_id] = time.monotonic()

    async def _check_left_running(self, s: Stream) -> None:
        if s.terminal != "aborted":
            return
        await asyncio.sleep(ABANDON_CHECK_S)
        for i in range(WORKERS):
            if f"worker-{i}" in self.killed_workers:
                continue
            with contextlib.suppress(Exception):
                if s.request_id in await running_on(self.nc, f"w{i}"):
                    self.left_running.add(s.request_id)

    async def _drain(self, deadline_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(deadline_s):
                while any(not s.terminal for _, s in self.streams):
                    await asyncio.sleep(0.2)

    def _tally(self, took_s: float) -> dict:
        outcomes: Counter = Counter()
        reasons: Counter = Counter()
        failures = []
        by_via: dict[str, Counter] = {"nats": Counter(), "http": Counter()}
        for p, s in self.streams:
            kind = outcome(s)
            outcomes[kind] += 1
            by_via[p.via][kind] += 1
            if kind in ("failed_clean", "lost"):
                reasons[f"{p.via} {s.status} {s.message[:70]}"] += 1
                failures.append({"via": p.via, "sent_s": p.at_s, "tier": p.tier, "kind": kind, "accepted": s.accepted,
                                 "status": s.status,
                                 "ended_s": round(s.end_s - self.t0, 2) if s.end_s else None,
                                 "message": s.message[:160]})
        return {
            "probe": "chaos", "layout": layout(self.args), "seed": self.seed, "load_s": self.args.chaos_s, "rate": self.args.chaos_rate,
            "sent": len(self.streams), "completed": outcomes["completed"], "failed_clean": outcomes["failed_clean"],
            "aborted": outcomes["aborted"], "lost": outcomes["lost"], "hung": outcomes["hung"],
            "silent_short": outcomes["silent_short"],
            "duplicated": sum(s.extra if isinstance(s, HttpStream) else s.dup for _, s in self.streams),
            "left_running": len(self.left_running),
            "left_running_by_how": dict(Counter(p.how or p.via for p, s in self.streams if s.request_id in self.left_running)),
            "by_via": {k: dict(v) for k, v in by_via.items()},
            "wire": self._wire(),
            "reasons": dict(reasons.most_common(8)), "failures": failures, "faults": self.faults, "took_s": round(took_s, 1),
        }


    def _wire(self) -> dict:
        """The NATS half on the wire (`WireCount`): streams with a seq repeated, with more than one
        generation, and each such stream's story (times from the load's start), to be set against
        the faults' (a worker kill's running streams are migrated: one more generation each)."""
        c = self.client
        regenerated = {rid: g for rid, g in c.generations.items() if len(g) > 1}
        sent = {s.request_id: p for p, s in self.streams}
        story = []
        for rid in sorted(set(regenerated) | set(c.repeats), key=lambda r: sent[r].at_s if r in sent else 0):
            n, first, last = c.repeats.get(rid, (0, 0.0, 0.0))
            story.append({"request": rid[:12], "sent_s": sent[rid].at_s if rid in sent else None,
                          "max_tokens": sent[rid].max_tokens if rid in sent else None,
                          "generations": [[round(t - self.t0, 2), w, q] for t, w, q in c.generations.get(rid, ())],
                          "repeats": n, "repeats_s": [round(first - self.t0, 2), round(last - self.t0, 2)] if n else []})
        return {"repeated_seqs": sum(int(r[0]) for r in c.repeats.values()), "streams_with_repeats": len(c.repeats),
                "streams_regenerated": len(regenerated),
                "extra_generations": sum(len(g) - 1 for g in regenerated.values()),
                "resumes": c.resumes, "streams": story[:40]}


def layout(args) -> str:
    """`--layout`: `in-queue` (up's default: the HTTP edge in the queue's process) or `apart`."""
    return getattr(args, "layout", None) or "in-queue"


def outcome(s: Stream) -> str:
    if s.terminal == "aborted":
        return "aborted"
    if s.terminal in ("error", "rejected") and any(m in s.message for m in LOST_MESSAGES):
        return "lost"
    if not s.terminal:
        return "lost" if s.accepted else "hung"
    return s.outcome


async def probe_chaos(args) -> dict:
    if args.baseline:
        from bench.baseline import baseline_env
        with baseline_env(args.baseline) as env:
            row = await Chaos(args).run(env)
        row["code"] = args.baseline
        return row
    return await Chaos(args).run({})
