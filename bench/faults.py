"""Fault probes on a fleet of real processes (`tokenyard up`'s FleetProcesses) on a real
nats-server. Each probe sends streams, breaks something, and reads every stream raw (its own
inbox, no client-side repair) to print, per probe:

    sent · completed (finished, every token, no gap) · failed_clean (an error or rejection) ·
    hung (no terminal event by the deadline) · duplicated (chunks whose seq came twice: the
    protocol tells receivers to drop them) · gaps (streams with a seq hole) · silent_short (a
    `finished` after a hole: what a client would take as complete; TokenyardClient turns it
    into an error)

Probes (`--probe NAME`, repeatable; default all):
  worker-kill      SIGKILL one of 2 workers under 100 concurrent streams, migration on
  worker-kill-off  the same with `tokenyard router --no-migration`: time to a clean error
  nats-restart     stop the nats-server for 6 s under 50 streams, start it again (same store)
  queue-kill       SIGKILL the queue holding ≥ 1,000 queued requests while a standby runs
  overload-rss     10× the fleet's rate over HTTP for --overload-s, with bad input mixed in;
                   every process's RSS before, at peak and after

    python -m bench.faults [--probe worker-kill ...] [--json docs/results-faults.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from nats.aio.client import Client
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from bench._out import write_result
from tokenyard.launcher import FleetProcesses, ping

PROBES = ("worker-kill", "worker-kill-off", "nats-restart", "queue-kill", "overload-rss")


# ───────────────────────────── reading streams raw ─────────────────────────────


@dataclass
class Stream:
    request_id: str
    max_tokens: int
    seqs: list[int] = field(default_factory=list)
    tokens: int = 0
    dup: int = 0
    seen: set[int] = field(default_factory=set)
    reordered: bool = False
    """A seq came before a smaller one (a hole, possibly filled later by a replay)."""
    accepted: bool = False
    terminal: str = ""
    """finished / error / rejected; '' = none yet."""
    status: int = 0
    finished_seq: int = -1
    worker_id: str = ""
    message: str = ""
    end_s: float = 0.0
    first_chunk: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def on_event(self, e: schemas.StreamEvent) -> None:
        if self.terminal:
            return
        match e:
            case schemas.Accepted():
                self.accepted = True
            case schemas.Chunk():
                if e.seq in self.seen:
                    self.dup += 1
                    return
                if e.seq != len(self.seqs):
                    self.reordered = True
                self.seen.add(e.seq)
                self.seqs.append(e.seq)
                self.tokens += len(e.token_ids)
                self.first_chunk.set()
            case schemas.Finished():
                self._end("finished", 200)
                self.finished_seq, self.worker_id = e.seq, e.worker_id
            case schemas.Error():
                self._end("error", e.status)
                self.message = e.message
            case schemas.Rejected():
                self._end("rejected", e.status)
                self.message = e.message

    def _end(self, kind: str, status: int) -> None:
        self.terminal, self.status, self.end_s = kind, status, time.monotonic()
        self.done.set()

    @property
    def hole(self) -> bool:
        """Seqs missing for good (as of the stream's end, or now)."""
        return len(self.seen) != (max(self.seen) + 1 if self.seen else 0)

    @property
    def outcome(self) -> str:
        if not self.terminal:
            return "hung"
        if self.terminal != "finished":
            return "failed_clean"
        if self.hole or self.tokens < self.max_tokens or self.finished_seq != len(self.seqs):
            return "silent_short"
        return "completed"


async def submit(nc: Client, max_tokens: int, prompt: str, headers: dict | None = None) -> Stream:
    s = Stream(uuid.uuid4().hex, max_tokens)
    inbox = nc.new_inbox()

    async def cb(msg) -> None:
        if not msg.data:
            if msg.headers and msg.headers.get("Status") == "503":
                s._end("rejected", 503)
            return
        with contextlib.suppress(codec.DecodeError):
            s.on_event(codec.decode_event(msg.data, msg.headers))

    sub = await nc.subscribe(inbox, cb=cb)
    req = schemas.GenerateRequest(prompt=prompt, max_tokens=max_tokens, request_id=s.request_id, ignore_eos=True)
    await nc.publish(subjects.SUBMIT, codec.encode(req), reply=inbox, headers=headers)
    s.done_cb = sub  # keep the subscription alive with the stream
    return s


async def submit_via_client(client: TokenyardClient, max_tokens: int, prompt: str) -> Stream:
    """The same stream as a user of TokenyardClient (or the edge) sees it: repeats already
    dropped, gaps and lost ends already turned into errors by the client."""
    s = Stream(uuid.uuid4().hex, max_tokens)
    req = schemas.GenerateRequest(prompt=prompt, max_tokens=max_tokens, request_id=s.request_id, ignore_eos=True)

    async def read() -> None:
        async for e in client.stream(req):
            s.on_event(e)

    s.task = asyncio.create_task(read())
    return s


def note(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def tally(name: str, streams: list[Stream], **extra) -> dict:
    c = Counter(s.outcome for s in streams)
    row = {
        "probe": name,
        "sent": len(streams),
        "completed": c["completed"],
        "failed_clean": c["failed_clean"],
        "hung": c["hung"],
        "duplicated": sum(s.dup for s in streams),
        "gaps": sum(1 for s in streams if s.hole),
        "reordered": sum(1 for s in streams if s.reordered),
        "silent_short": c["silent_short"],
    }
    errors = Counter(f"{s.status} {s.message[:60]}" for s in streams if s.terminal in ("error", "rejected"))
    if errors:
        row["errors"] = dict(errors.most_common(4))
    row.update(extra)
    return row


async def wait_all(streams: list[Stream], deadline_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline_s):
            await asyncio.gather(*(s.done.wait() for s in streams))


def proc(fleet: FleetProcesses, name: str) -> subprocess.Popen:
    return next(p for n, p in fleet.procs if n == name)


async def running_on(nc: Client, worker_id: str) -> set[str]:
    import msgspec

    msg = await nc.request(subjects.worker_status(worker_id), b"", timeout=2)
    return set(msgspec.msgpack.decode(msg.data, type=list[str]))


def fleet_for(args, **kw) -> FleetProcesses:
    return FleetProcesses(workers=kw.pop("workers", 2), profile=args.profile, http_port=0,
                          log_dir=args.log_dir, **kw)


# ───────────────────────────── probes ─────────────────────────────


async def probe_worker_kill(args, migration: bool) -> dict:
    name = "worker-kill" if migration else "worker-kill-off"
    fleet = fleet_for(args, router_args=[] if migration else ["--no-migration"])
    await fleet.start()
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        streams = [await submit(nc, args.tokens, f"probe {i} " * 16) for i in range(args.streams)]
        async with asyncio.timeout(60):
            await asyncio.gather(*(s.first_chunk.wait() for s in streams))
        victim = await running_on(nc, "w0")
        kill_s = time.monotonic()
        proc(fleet, "worker-0").send_signal(signal.SIGKILL)
        await wait_all(streams, args.deadline_s)
        on_victim = [s for s in streams if s.request_id in victim]
        errors = [s.end_s - kill_s for s in on_victim if s.terminal == "error"]
        row = tally(name, streams, on_killed_worker=len(on_victim),
                    completed_of_killed=sum(1 for s in on_victim if s.outcome == "completed"),
                    max_s_to_error=round(max(errors), 2) if errors else None,
                    finished_by=dict(Counter(s.worker_id for s in streams if s.terminal == "finished")))
        await nc.drain()
        return row
    finally:
        await fleet.stop()


class RestartableNats:
    """A nats-server on a fixed port and store dir that can be stopped and started again."""

    def __init__(self) -> None:
        self.port = natsutil.free_port()
        self.store = tempfile.mkdtemp(prefix="tokenyard-faults-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [natsutil.nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(200):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise TimeoutError("nats-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


async def probe_nats_restart(args) -> dict:
    server = RestartableNats()
    await server.start()
    fleet = fleet_for(args, nats_url=server.url)
    await fleet.start()
    try:
        nc = await natsutil.connect(server.url, "bench-faults")
        client = TokenyardClient(await natsutil.connect(server.url, "bench-faults-client"))
        streams = [await submit(nc, 400, f"probe {i} " * 16) for i in range(25)]
        viewed = [await submit_via_client(client, 400, f"client {i} " * 16) for i in range(25)]
        async with asyncio.timeout(60):
            await asyncio.gather(*(s.first_chunk.wait() for s in streams + viewed))
        server.stop()
        await asyncio.sleep(6.0)  # the outage the issue measured
        await server.start()
        t0 = time.monotonic()
        want = fleet.expected()
        while True:
            with contextlib.suppress(Exception):
                have = await ping(nc)
                if all(have[k] >= v for k, v in want.items()):
                    break
            if time.monotonic() - t0 > 60:
                break
        reconnect_s = round(time.monotonic() - t0, 2)
        await wait_all(streams + viewed, args.deadline_s)
        after = [await submit(nc, 16, f"after {i}") for i in range(20)]
        await wait_all(after, 30)
        raw = tally("nats-restart (raw inbox)", streams, services_back_s=reconnect_s,
                    new_requests_completed=f"{sum(s.outcome == 'completed' for s in after)}/20")
        seen = tally("nats-restart (TokenyardClient)", viewed,
                     error_statuses=dict(Counter(s.status for s in viewed if s.terminal == "error")))
        await client.close()
        await client.nc.drain()
        await nc.drain()
        return [raw, seen]
    finally:
        await fleet.stop()
        server.stop()


async def queue_depth(nc: Client) -> int:
    """Requests waiting, summed over every queue replica (from their QueueStats fan-out)."""
    sub = await nc.subscribe(subjects.QUEUE_STATE)
    latest: dict[str, int] = {}
    with contextlib.suppress(Exception):
        async with asyncio.timeout(0.5):
            while True:
                st = codec.decode((await sub.next_msg(timeout=0.5)).data, schemas.QueueStats)
                latest[st.instance_id] = sum(st.depth)
    await sub.unsubscribe()
    return sum(latest.values())


async def probe_queue_kill(args) -> dict:
    # No worker yet: the queue replicas hold every request until one comes, after the kill.
    fleet = fleet_for(args, workers=0)
    await fleet.start()
    base = [sys.executable, "-m", "tokenyard.cli"]
    standby = subprocess.Popen([*base, "queue", "--nats", fleet.nats_url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    late = None
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        async with asyncio.timeout(30):
            while (await ping(nc))["tokenyard-queue"] < 2:
                pass
        hdrs = {"x-request-tier": "P3"}  # no TTFT target: admission queues them all
        streams = list(await asyncio.gather(*(submit(nc, 32, f"queued {i}", hdrs) for i in range(args.queued))))
        async with asyncio.timeout(120):  # every request admitted (queued or running)
            while not all(s.accepted or s.terminal for s in streams):
                await asyncio.sleep(0.05)
        depth = await queue_depth(nc)
        note(f"queue-kill: {sum(s.accepted for s in streams)} accepted, {depth} queued; SIGKILL the queue")
        proc(fleet, "queue").send_signal(signal.SIGKILL)
        late = subprocess.Popen([*base, "worker", "--nats", fleet.nats_url, "--engine", "sim", "--profile",
                                 args.profile, "--id", "w-late"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await wait_all(streams, args.deadline_s + 120)  # held ones come back after ack_wait (30 s)
        note(f"queue-kill: {Counter(s.outcome for s in streams)}")
        finishes = Counter(s.request_id for s in streams if s.terminal == "finished")
        row = tally("queue-kill", streams, queued_at_kill=depth,
                    rejected=sum(1 for s in streams if s.terminal == "rejected"),
                    served_twice=sum(1 for s in streams if s.dup) + sum(v > 1 for v in finishes.values()))
        await nc.drain()
        return row
    finally:
        for p in (standby, late):
            if p is None:
                continue
            p.send_signal(signal.SIGTERM)
            for _ in range(300):
                if p.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if p.poll() is None:
                p.kill()
        await fleet.stop()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def edge_in_flight(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("tokenyard:edge_in_flight_requests "):
                return float(line.split()[1])
    return 0.0


BAD_BODIES = (b'{"model": "tokenyard-sim", "prompt": ', b'{"prompt": "x", "max_tokens": -1}',
              b'{"prompt": 5}', b"[" * 1000 + b"]" * 1000, b'{"prompt": "x", "max_tokens": 1e30}')


async def probe_overload_rss(args) -> dict:
    fleet = fleet_for(args)
    await fleet.start()
    try:
        url = f"{fleet.http_url}/v1/completions"
        pids = {name: p.pid for name, p in fleet.procs}
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as http:
            async def one(i: int, bad: bool = False) -> int | str:
                try:
                    if bad:
                        data = BAD_BODIES[i % len(BAD_BODIES)]
                        async with http.post(url, data=data, headers={"content-type": "application/json"}) as r:
                            await r.read()
                            return r.status
                    body = {"model": "tokenyard-sim", "prompt": f"load {i} " * 32, "max_tokens": 32,
                            "stream": i % 2 == 0}
                    async with http.post(url, json=body) as r:
                        await r.read()
                        return r.status
                except Exception as e:  # the load generator's own failure, by kind
                    return type(e).__name__

            # Capacity: a closed loop of 32 for 10 s; the baseline RSS after it (imports warm).
            t0, done = time.monotonic(), 0

            async def closed(k: int) -> None:
                nonlocal done
                while time.monotonic() - t0 < 10:
                    if await one(k) == 200:
                        done += 1

            await asyncio.gather(*(closed(k) for k in range(32)))
            capacity = done / 10
            await asyncio.sleep(3)
            base = {n: rss_mb(p) for n, p in pids.items()}
            rate = 10 * capacity
            peak = dict(base)
            statuses: Counter = Counter()
            tasks: set[asyncio.Task] = set()
            start = time.monotonic()
            i = 0
            rng = random.Random(0)
            while (now := time.monotonic()) - start < args.overload_s:
                due = int((now - start) * rate)
                while i < due:
                    t = asyncio.create_task(one(i, bad=rng.random() < 0.1))
                    t.add_done_callback(lambda t: statuses.update(["gave_up" if t.cancelled() else t.result()]))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    i += 1
                if i % 200 == 0:
                    for n, p in pids.items():
                        peak[n] = max(peak[n], rss_mb(p))
                await asyncio.sleep(0.01)
            sent_s = time.monotonic() - start
            for n, p in pids.items():
                peak[n] = max(peak[n], rss_mb(p))
            # What the fleet has not served 30 s after the overload, its clients give up on
            # (they disconnect, the edge aborts).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*list(tasks), return_exceptions=True)
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while await edge_in_flight(http, fleet.http_url) > 0:
                    await asyncio.sleep(0.5)
        await asyncio.sleep(5)  # idle: the edge trims after 1 s
        after = {n: rss_mb(p) for n, p in pids.items()}
        per_process = {n: {"base_mb": round(base[n], 1), "peak_mb": round(peak[n], 1), "after_mb": round(after[n], 1),
                           "delta_mb": round(after[n] - base[n], 1)} for n in pids}
        return {"probe": "overload-rss", "capacity_rps": round(capacity, 1), "offered_rps": round(i / sent_s, 1),
                "sent": i, "statuses": dict(statuses), "worst_delta_mb": max(v["delta_mb"] for v in per_process.values()),
                "rss": per_process}
    finally:
        await fleet.stop()


# ───────────────────────────── main ─────────────────────────────

COLUMNS = ("probe", "sent", "completed", "failed_clean", "hung", "duplicated", "gaps", "silent_short")


def print_row(row: dict) -> None:
    if "completed" in row:
        print("  ".join(f"{c}={row[c]}" for c in COLUMNS))
    rest = {k: v for k, v in row.items() if k not in COLUMNS}
    print("    " + json.dumps(rest))
    sys.stdout.flush()


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", action="append", choices=PROBES)
    ap.add_argument("--profile", default="a100-llama3-8b")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--queued", type=int, default=1200)
    ap.add_argument("--overload-s", type=float, default=60.0)
    ap.add_argument("--deadline-s", type=float, default=90.0, help="after the fault: later = hung")
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENYARD_LOG_LEVEL", "WARNING")
    rows = []
    for name in args.probe or PROBES:
        run = {"worker-kill": lambda: probe_worker_kill(args, True),
               "worker-kill-off": lambda: probe_worker_kill(args, False),
               "nats-restart": lambda: probe_nats_restart(args),
               "queue-kill": lambda: probe_queue_kill(args),
               "overload-rss": lambda: probe_overload_rss(args)}[name]
        out = await run()
        for row in out if isinstance(out, list) else [out]:
            print_row(row)
            rows.append(row)
    write_result(args.json, {"rows": rows}, "python -m bench.faults")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
