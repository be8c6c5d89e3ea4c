"""A stream whose placing router and then its worker die inside the hand-over window (the worker
hands a dead router's streams over only 3-9 s after the death, services/worker/leases.py) is
known to nobody alive but its client. TokenyardClient probes the worker's `alive` subject once
the stream is silent; two "no responders" with no router moving it in between, and it resumes
the stream once on a new inbox (shared/stream_watch.py, shared/resume.py): it completes with
every token once. A resumed stream lost again is ended with a clear 503, not silence.
Live, on a nats-server of its own: two workers, admission, the queue, router A (which places
every stream), router B (alive, knows none of them)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import client as client_mod
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import IDLE_TIMEOUT_S
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.stream_watch import FLOOR_S, StreamWatch

from tests.conftest import stop_hosts, until
from tests.fault_fleet import crash_worker, start_fleet, start_streams, stop_fleet

GRACE_S = 2.0
"""The routers' re-issue deadline a client waits after a resumed stream's second loss (10 s in
production): shortened here, the rule is the same."""
TOKENS = 1500
"""Long enough to run on both workers when they die (~15 s of streaming), short enough to end
well within the test's bound on a machine 2-3x slower."""
ENDS_WITHIN_S = 3 * IDLE_TIMEOUT_S
"""A bound on the whole test, not a measure: the streams' own ends are told apart from the 60 s
idle watchdog by what they are (a `finished`, a 503), not by when they come."""


async def lose_router_then_worker(server_url: str, hosts: list[ServiceHost]):
    """Streams placed by router A on both workers; router B starts; A dies, then at once the
    worker fw0. → (client, recs, tasks, router B, the ids that were on fw0, when fw0 died)."""
    router_a = hosts[-1]
    nc, client, recs, tasks = await start_streams(server_url, 8, TOKENS)
    router_b = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server_url).start()
    await until(lambda: router_b.shell.core.view.n >= 2, what="router B hears both workers")
    lost = set(hosts[0].shell.core.running_ids())
    assert lost and lost != {r.events[0].request_id for r in recs}, "streams on both workers"
    named = [e.worker_id for r in recs for e in r.events if isinstance(e, schemas.Chunk) and e.worker_id]
    assert sorted(set(named)) == ["fw0", "fw1"] and len(named) == len(recs)  # each first chunk names one
    router_a._stopped.set()  # router A dies as a SIGKILL would: its connection goes
    await router_a.nc.close()
    t0 = time.monotonic()
    await crash_worker(hosts[0])  # at once: far inside the window
    return client, recs, tasks, router_b, lost, t0


async def test_a_stream_whose_router_then_worker_died_is_resumed_by_its_client_and_completes():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url)
    router_b = None
    try:
        client, recs, tasks, router_b, lost, t0 = await lose_router_then_worker(server.url, hosts)
        async with asyncio.timeout(ENDS_WITHIN_S):
            await asyncio.gather(*tasks)
        for rec in recs:
            assert isinstance(rec.last, schemas.Finished), rec.last
            assert rec.seqs() == list(range(len(rec.seqs())))  # every seq once, none missing
            assert rec.tokens() == TOKENS and rec.last.usage.completion_tokens == TOKENS
            assert rec.last.seq == len(rec.seqs())
            if rec.events[0].request_id in lost:  # resumed: the silence, two probes FLOOR_S apart, then it
                assert rec.last.worker_id == "fw1"
                assert rec.end_s - t0 >= 2 * FLOOR_S
        assert client.resumes == len(lost)  # once each, and only the lost ones
        await client.close()
    finally:
        await _stop(hosts, router_b, server)


async def test_a_resumed_stream_lost_again_ends_with_a_503_not_silence(monkeypatch):
    """fw1 too dies once the lost streams are resumed (on it: it is the only worker left), with
    router B — which placed the resumed ones — alive: B has no worker to move them to, and
    ends them itself with a 503 within its re-issue deadline (or the client does, GRACE_S after
    its own proof); a stream resumed now for the first time finds no worker either, and its
    refusal ends it as a 503. Every stream ends with a clear error, not the 60 s idle timeout."""
    monkeypatch.setattr(client_mod, "StreamWatch", functools.partial(StreamWatch, grace_s=GRACE_S))
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url)
    router_b = None
    try:
        client, recs, tasks, router_b, lost, t0 = await lose_router_then_worker(server.url, hosts)
        await until(lambda: client.resumes == len(lost) and lost <= set(hosts[1].shell.core.running_ids()),
                    ENDS_WITHIN_S, 0.05, what="the lost streams resumed on fw1")
        await crash_worker(hosts[1])
        async with asyncio.timeout(ENDS_WITHIN_S):
            await asyncio.gather(*tasks)
        for rec in recs:
            end = rec.last
            assert isinstance(end, schemas.Error) and end.status == 503, end
            assert end.seq == len(rec.seqs()) and rec.seqs() == list(range(len(rec.seqs())))
            assert "no event for" not in end.message  # not the idle watchdog: the router's end, or the client's
        # Each stream once at most: fw1's own streams of router A, not yet handed to B when fw1
        # died, are resumed now (nobody else knows them either), the resumed ones not again.
        assert len(lost) <= client.resumes <= len(recs)
        await client.close()
    finally:
        await _stop(hosts, router_b, server)


async def _stop(hosts: list[ServiceHost], router_b: ServiceHost | None, server) -> None:
    with contextlib.suppress(Exception):
        await stop_hosts([hosts[-1]])  # router A: its connection is gone, what is left of it stops
    if router_b is not None:
        await stop_hosts([router_b])
    await stop_fleet(hosts[:-1])
    server.stop()


