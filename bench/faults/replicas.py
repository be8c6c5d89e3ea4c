"""Probes that SIGKILL one replica of a replicated service under load.

  edge-kill           a standalone `tokenyard edge --processes 2` (its supervisor) in front of the
                      fleet; streams over HTTP, each on its own connection; SIGKILL one of the
                      edge's processes mid-stream. Its clients' streams must end with an error,
                      never hang; the other process's clients are unaffected; the supervisor
                      starts the process again; the killed process's requests stop on their
                      workers (their routers abort them once its client lease lapses).
  queue-replica-kill  two `tokenyard queue --with-admission --with-router` processes (the fleet's
                      and a second), P3 streams submitted over NATS (admission's queue group
                      spreads them), SIGKILL the fleet's one mid-load: nothing admitted lost (every
                      accepted stream ends), nothing placed twice (no chunk seq twice, no stream
                      finished twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import aiohttp
from tokenyard.services.edge.supervisor import START_GRACE_S
from tokenyard.shared import janitor, natsutil

from bench.faults.fleet import fleet_for, proc, queue_replica, running_on, stop_process
from bench.faults.kills import env_as, log_file
from bench.faults.streams import note, submit, submit_via_http, tally, wait_all
from tokenyard.launcher import ping

BASE = [sys.executable, "-m", "tokenyard.cli"]
SUPERVISOR_GRACE_S = START_GRACE_S
"""A child dying sooner after the edge's start stops the edge (a copy of it, 10 s, went stale at 15)."""


def children_of(pid: int) -> list[int]:
    """The edge processes under a supervisor: not shared/janitor.py's sweeper, also its child (and
    the first started, so the lowest pid: the victim once was the sweeper, and nothing died)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(p) for p in f.read().split()]
    out = []
    for kid in kids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                if janitor.TAG.encode() not in f.read():
                    out.append(kid)
    return out


async def _until(cond, timeout_s: float, every_s: float = 0.05, since: float | None = None) -> float | None:
    """Seconds from `since` (a time.monotonic(); default: now) until `cond()` (sync or async)
    holds; None if it did not within `timeout_s` of the call."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return round(time.monotonic() - (t0 if since is None else since), 2)
        await asyncio.sleep(every_s)
    return None


async def probe_edge_kill(args) -> dict:
    fleet = fleet_for(args, edge_processes=1)
    await fleet.start()
    port = natsutil.free_port()
    edge = subprocess.Popen([*BASE, "edge", "--nats", fleet.nats_url, "--http-port", str(port), "--model",
                             fleet.model, "--processes", "2"], env=env_as(fleet, "edge"),
                            stdout=subprocess.DEVNULL, stderr=log_file(args, "edge-supervised"))
    base_url = f"http://127.0.0.1:{port}"
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        async with asyncio.timeout(60):
            while len(children_of(edge.pid)) < 2:
                await asyncio.sleep(0.05)
            started = time.monotonic()  # the supervisor's start-up grace began before this
            while (await ping(nc))["tokenyard-edge"] < 3:  # the fleet's edge and the 2
                await asyncio.sleep(0.1)
        # Past the supervisor's start-up grace (from its children's start, which comes after its
        # own imports), so the kill is a death to restart from, not a failed start.
        await asyncio.sleep(max(0.0, SUPERVISOR_GRACE_S + 1 - (time.monotonic() - started)))
        # A connection each, so the kernel spreads the streams over both processes.
        conn = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            streams = [await submit_via_http(http, base_url, args.tokens, f"edge {i} " * 16)
                       for i in range(args.edge_streams)]
            async with asyncio.timeout(60):
                await asyncio.gather(*(s.first_chunk.wait() for s in streams))
            before = set(children_of(edge.pid))
            running = set()
            for w in ("w0", "w1"):
                running |= await running_on(nc, w)
            victim = min(before)
            note(f"edge-kill: {len(streams)} streams, {len(running)} running on workers; SIGKILL edge pid {victim}")
            kill_s = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            lost_ids = await killed_streams(streams)

            def replaced() -> bool:
                now = set(children_of(edge.pid))
                return len(now) == 2 and victim not in now

            # timed from the kill while the other streams run on (round 7 counted from their end)
            watch = [asyncio.create_task(_until(replaced, 60, since=kill_s)),
                     asyncio.create_task(_until(lambda: _edges_answer(nc, 3), 60, 0.2, since=kill_s)),
                     asyncio.create_task(_until(lambda: orphans_gone(nc, lost_ids), 60, 0.2, since=kill_s))]
            await wait_all(streams, args.deadline_s)
            restarted_s, serving_s, orphans_stopped_s = await asyncio.gather(*watch)
            ended = [s for s in streams if s.terminal == "error"]
            to_error = [round(s.end_s - kill_s, 2) for s in ended]
            after = [await submit_via_http(http, base_url, 8, f"after {i}") for i in range(8)]
            await wait_all(after, 60)
        row = tally("edge-kill", streams, killed_process_streams=len(ended),
                    other_process_streams=len(streams) - len(ended),
                    max_s_to_error=max(to_error) if to_error else None,
                    restarted_s=restarted_s, answering_s=serving_s, orphans_stopped_s=orphans_stopped_s,
                    after_restart=dict(Counter(s.outcome for s in after)),
                    errors_sample=sorted({s.message[:50] for s in ended})[:3])
        await nc.drain()
        return row
    finally:
        await stop_process(edge, 20.0)
        await fleet.stop()


async def killed_streams(streams: list, settle_s: float = 0.5, within_s: float = 5.0) -> set[str]:
    """Right after a front's SIGKILL: the ids of the streams it cut (their connection closed:
    an error within milliseconds), once one has ended so and `settle_s` more has passed."""
    await _until(lambda: any(s.terminal == "error" for s in streams), within_s)
    await asyncio.sleep(settle_s)
    return {s.request_id for s in streams if s.terminal == "error"}


async def orphans_gone(nc, ids: set[str]) -> bool:
    """None of `ids` runs on the fleet's workers (w0, w1) any longer."""
    left = set()
    for w in ("w0", "w1"):
        left |= await running_on(nc, w)
    return not (left & ids)


async def _edges_answer(nc, n: int) -> bool:
    return (await ping(nc))["tokenyard-edge"] >= n


async def probe_queue_replica_kill(args) -> dict:
    fleet = fleet_for(args)
    await fleet.start()
    second = queue_replica(fleet, log_file(args, "queue-second"))
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        async with asyncio.timeout(60):
            while (await ping(nc))["tokenyard-queue"] < 2 or (await ping(nc))["tokenyard-admission"] < 2:
                await asyncio.sleep(0.1)
        hdrs = {"x-request-tier": "P3"}  # no TTFT target: nothing is refused for its wait
        streams = []
        for i in range(args.replica_streams):  # sent over ~2 s: the kill comes while they arrive and run
            streams.append(await submit(nc, args.replica_tokens, f"replica {i} " * 8, hdrs))
            if i % 20 == 19:
                await asyncio.sleep(0.1)
            if i == args.replica_streams // 2:
                accepted = sum(s.accepted for s in streams)
                note(f"queue-replica-kill: {len(streams)} sent, {accepted} accepted; SIGKILL the fleet's queue")
                proc(fleet, "queue").send_signal(signal.SIGKILL)
        await wait_all(streams, args.deadline_s + 60)  # held copies come back after ack_wait (30 s)
        finishes = Counter(s.request_id for s in streams if s.terminal == "finished")
        lost = [s for s in streams if s.accepted and not s.terminal]
        row = tally("queue-replica-kill", streams,
                    accepted=sum(s.accepted for s in streams),
                    lost_accepted=len(lost),
                    never_answered=sum(1 for s in streams if not s.accepted and not s.terminal),
                    placed_twice=sum(1 for s in streams if s.dup or s.after_end) + sum(v > 1 for v in finishes.values()),
                    events_after_end=sum(s.after_end for s in streams),
                    rejected=sum(1 for s in streams if s.terminal == "rejected"))
        await nc.drain()
        return row
    finally:
        await stop_process(second, 20.0)
        await fleet.stop()
