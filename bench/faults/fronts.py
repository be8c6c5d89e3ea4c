"""edge-kill on `tokenyard up`'s default layout (`--layout in-queue`): the HTTP edge runs in the
queue's process, beside admission and the router, so the edge's death is theirs too.

Two fronts serve one HTTP port (SO_REUSEPORT): the fleet's queue process and a second started
the same way (fleet.queue_replica). `--edge-streams` HTTP streams, a connection each (the kernel
spreads them over both by a hash of the connection, so now and then it gives one front them all:
which front holds each is read from /proc, fleet.http_peers, and more are opened, up to twice as
many, until both serve), and as many raw NATS streams (admission's queue group spreads them);
once every stream has its first token, SIGKILL the fleet's queue process. What must hold:

  * the killed front's HTTP clients get a prompt, clear failure (the connection closes), never
    a hang (`max_s_to_error`);
  * the surviving front's HTTP clients complete, and every NATS client's admitted request
    completes (its worker runs on; a stored copy the killed queue held comes back to the survivor
    after the 30 s ack wait): `nats_not_completed` 0, nothing twice (`duplicated`, `events_after_end`);
  * new requests, over HTTP and NATS, are served by the survivor (`after`);
  * the killed front's requests stop on their workers (`orphans_stopped_s`; None: still running
    60 s after the kill). The router that placed them died with the front; their workers follow
    their client's lease (services/worker/leases.py) and stop them. Before round 13 nobody did:
    they ran to their end.

`--baseline REF` runs the fleet's processes (both fronts, the workers) on REF's code.
`--then-kill-worker`: `--worker-kill-after` (THEN_KILL_WORKER_S) after the front, SIGKILL worker 0
as well. Once the workers have handed the dead front's streams to the surviving router
(shared/adoption.py), every NATS stream must still complete, the dead front's too
(`nats_not_completed` 0). That hand-over comes on the second "no responders" of the dead router,
3 s after the first: 3-9 s after the kill (~5 s measured, Round 14), so the default 5 s falls
inside that window and the dead front's raw NATS streams on worker 0 are lost; 10 s is past it.
`--nats-via client` reads the NATS streams with one TokenyardClient instead, which resumes those
(shared/resume.py): `nats_resumed` counts them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import aiohttp
from tokenyard.shared import natsutil
from tokenyard.shared.client import TokenyardClient

from bench.faults.fleet import fleet_for, http_peers, proc, queue_replica, running_on, stop_process
from bench.faults.kills import log_file
from bench.faults.replicas import _until as until
from bench.faults.replicas import killed_streams, orphans_gone
from bench.faults.streams import note, submit, submit_via_client, submit_via_http, tally, wait_all
from tokenyard.launcher import ping

FRONTS_READY_S = 60.0
THEN_KILL_WORKER_S = 5.0


async def probe_front_kill(args) -> dict:
    if getattr(args, "baseline", None):
        from bench.baseline import baseline_env
        with baseline_env(args.baseline) as env:
            row = await _front_kill(args, env)
        row["code"] = args.baseline
        return row
    return await _front_kill(args, {})


async def _front_kill(args, env: dict[str, str]) -> dict:
    fleet = fleet_for(args, extra_env=env)
    await fleet.start()
    second = queue_replica(fleet, log_file(args, "queue-second"), env)
    try:
        nc = await natsutil.connect(fleet.nats_url, "bench-faults")
        async with asyncio.timeout(FRONTS_READY_S):
            while True:
                have = await ping(nc)
                if min(have[f"tokenyard-{k}"] for k in ("queue", "admission", "edge")) >= 2:
                    break
                await asyncio.sleep(0.1)
        conn = aiohttp.TCPConnector(force_close=True, limit=0)  # a connection each: both fronts serve
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            web = [await submit_via_http(http, fleet.http_url, args.tokens, f"front {i} " * 16)
                   for i in range(args.edge_streams)]
            client = TokenyardClient(nc) if getattr(args, "nats_via", "raw") == "client" else None
            raw = [await (submit(nc, args.tokens, f"nats {i} " * 16) if client is None
                          else submit_via_client(client, args.tokens, f"nats {i} " * 16))
                   for i in range(args.edge_streams)]
            async with asyncio.timeout(60):
                await asyncio.gather(*(s.first_chunk.wait() for s in (*web, *raw)))
            port = int(fleet.http_url.rsplit(":", 1)[1])
            killed_pid = proc(fleet, "queue").pid

            def fronts() -> tuple[set[str], set[str]]:
                """Which front holds each HTTP stream's connection (killed, other)."""
                on_killed, on_other = http_peers(killed_pid, port), http_peers(second.pid, port)
                return ({s.request_id for s in web if s.local_port in on_killed},
                        {s.request_id for s in web if s.local_port in on_other})

            on_killed, on_other = fronts()
            while not (on_killed and on_other) and len(web) < 2 * args.edge_streams:
                # the kernel's hash gave one front every connection so far: more, until both serve
                web.append(s := await submit_via_http(http, fleet.http_url, args.tokens, f"front {len(web)} " * 16))
                async with asyncio.timeout(60):
                    await s.first_chunk.wait()
                on_killed, on_other = fronts()
            running = set()
            for w in ("w0", "w1"):
                running |= await running_on(nc, w)
            note(f"edge-kill (in-queue): {len(web)} HTTP + {len(raw)} NATS streams, {len(running)} running on "
                 f"workers; SIGKILL the fleet's queue process (its edge, admission, queue and router)")
            kill_s = time.monotonic()
            proc(fleet, "queue").send_signal(signal.SIGKILL)
            cut_ids = await killed_streams(web)
            orphans = asyncio.create_task(until(lambda: orphans_gone(nc, cut_ids), 60, 0.2, since=kill_s))
            worker_killed_s = None
            if getattr(args, "then_kill_worker", False):
                after_s = getattr(args, "worker_kill_after", None) or THEN_KILL_WORKER_S
                await asyncio.sleep(after_s - (time.monotonic() - kill_s))
                worker_killed_s = round(time.monotonic() - kill_s, 2)
                if not orphans.done():  # w0's status goes with it: orphans still running then read None
                    orphans.cancel()
                note(f"edge-kill (in-queue): SIGKILL worker 0 too, {worker_killed_s} s after the front")
                proc(fleet, "worker-0").send_signal(signal.SIGKILL)
            await wait_all([*web, *raw], args.deadline_s)
            orphans_stopped_s = None if orphans.cancelled() else await orphans
            cut = [s for s in web if s.terminal == "error"]
            to_error = [round(s.end_s - kill_s, 2) for s in cut]
            after_web = [await submit_via_http(http, fleet.http_url, 8, f"after {i}") for i in range(8)]
            after_raw = [await submit(nc, 8, f"after nats {i}") for i in range(8)]
            await wait_all([*after_web, *after_raw], 60)
            resumed = None
            if client is not None:
                resumed = client.resumes
                await client.close()
        finishes = Counter(s.request_id for s in raw if s.terminal == "finished")
        row = tally("edge-kill", [*web, *raw], layout="in-queue",
                    http_killed_front=len(on_killed), http_other_front=len(on_other),
                    http_on_neither=len(web) - len(on_killed) - len(on_other),
                    http_killed_cut=sum(s.request_id in on_killed for s in cut),
                    http_other_completed=sum(s.outcome == "completed" for s in web if s.request_id in on_other),
                    max_s_to_error=max(to_error) if to_error else None,
                    nats_completed=sum(s.outcome == "completed" for s in raw),
                    nats_not_completed=sum(s.outcome != "completed" for s in raw),
                    nats_finished_twice=sum(v > 1 for v in finishes.values()),
                    events_after_end=sum(s.after_end for s in raw),
                    orphans_stopped_s=orphans_stopped_s, worker_killed_s=worker_killed_s,
                    nats_via=getattr(args, "nats_via", "raw"), nats_resumed=resumed,
                    after={"http": dict(Counter(s.outcome for s in after_web)),
                           "nats": dict(Counter(s.outcome for s in after_raw))},
                    errors_sample=sorted({s.message[:50] for s in cut})[:3])
        await nc.drain()
        return row
    finally:
        await stop_process(second, 20.0)
        await fleet.stop()
