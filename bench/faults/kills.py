"""Probes that SIGKILL one process under load.

  worker-kill      SIGKILL one of 2 workers under 100 concurrent streams, migration on
  worker-kill-off  the same with `tokenyard router --no-migration`: time to a clean error
  queue-kill       SIGKILL the queue holding ≥ 1,000 queued requests while a standby runs
                   (a second queue process started as the fleet's: router and admission in it)
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

from nats.aio.client import Client
from tokenyard.shared import codec, nats_auth, natsutil, schemas, subjects

from bench.faults.fleet import fleet_for, proc, queue_replica, running_on, stop_process
from bench.faults.streams import note, submit, tally, wait_all
from tokenyard.launcher import ping


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


def env_as(fleet, kind: str) -> dict[str, str]:
    return {**os.environ, **nats_auth.child_env(fleet.nats_url, kind)}


def log_file(args, name: str):
    return open(os.path.join(args.log_dir, f"{name}.log"), "a") if args.log_dir else subprocess.DEVNULL


async def probe_queue_kill(args) -> dict:
    # No worker yet: the queue replicas hold every request until one comes, after the kill.
    fleet = fleet_for(args, workers=0)
    await fleet.start()
    base = [sys.executable, "-m", "tokenyard.cli"]
    # The fleet's server is secured: each extra process gets its kind's credentials.
    standby = late = None
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        hdrs = {"x-request-tier": "P3"}  # no TTFT target: admission queues them all
        streams = list(await asyncio.gather(*(submit(nc, 32, f"queued {i}", hdrs) for i in range(args.queued))))
        async with asyncio.timeout(120):  # every request admitted (queued or running)
            while not all(s.accepted or s.terminal for s in streams):
                await asyncio.sleep(0.05)
        # The standby starts once the fleet's queue holds them all: it runs admission too (as
        # the fleet's queue does), which would otherwise have taken half the submits
        standby = queue_replica(fleet, log_file(args, "queue-standby"))
        async with asyncio.timeout(30):
            while (await ping(nc))["tokenyard-queue"] < 2:
                await asyncio.sleep(0.1)
        depth = await queue_depth(nc)
        note(f"queue-kill: {sum(s.accepted for s in streams)} accepted, {depth} queued; SIGKILL the queue")
        proc(fleet, "queue").send_signal(signal.SIGKILL)
        late = subprocess.Popen([*base, "worker", "--nats", fleet.nats_url, "--engine", "sim", "--profile",
                                 args.profile, "--id", "w-late"], env=env_as(fleet, "worker"), stdout=subprocess.DEVNULL,
                                stderr=log_file(args, "worker-late"))
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
            await stop_process(p, 15.0)
        await fleet.stop()
