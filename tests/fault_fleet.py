"""The fault suite's fleet over a real nats-server: in-process services, a worker that dies
as a SIGKILL would, and a recorder of each stream's events (tests/test_faults_*.py)."""

from __future__ import annotations

import asyncio
import time

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.migration import MigrationConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import config, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import stop_hosts, until

TOK = ByteTokenizer()


def worker(wid: str, prof: str = "a100-llama3-8b") -> WorkerShell:
    return WorkerShell(WorkerConfig(wid, config.DEFAULT_MODEL), SimEngine(SimEngineCore(profile(prof), 16)), TOK)


async def start_fleet(url: str, workers: int = 2, migration: MigrationConfig | None = None,
                      router: bool = True) -> list[ServiceHost]:
    nc = await natsutil.connect(url, "fault-setup")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.drain()
    hosts = [await ServiceHost(worker(f"fw{i}"), url).start() for i in range(workers)]
    hosts.append(await ServiceHost(AdmissionShell(AdmissionConfig(), TOK), url).start())
    hosts.append(await ServiceHost(QueueShell(QueueConfig(), FCFS()), url).start())
    if router:
        hosts.append(await ServiceHost(RouterShell(RouterConfig(policy="least-loaded"), migration=migration), url).start())
        shell = hosts[-1].shell
        await until(lambda: shell.core.view.n >= workers)
    return hosts


async def stop_fleet(hosts: list[ServiceHost]) -> None:
    while CLIENTS:
        nc = CLIENTS.pop()
        if not nc.is_closed:
            await nc.close()
    await stop_hosts(hosts)


async def crash_worker(host: ServiceHost) -> None:
    """Die without a word, as a SIGKILL would: the connection goes, nothing is finished."""
    # In-process SIGKILL: a service has, by design, no public way to die without a word, so
    # this reaches into its host and shell (the process-level tests kill real processes).
    shell = host.shell
    host._stopped.set()  # its host's stop() is a no-op from now on
    for t in shell._timers:
        t.cancel()
    await host.nc.close()
    for t in list(shell._streams.values()):
        t.cancel()
    await shell.engine.stop()


class Recorder:
    """One stream's events as the client hands them on."""

    def __init__(self) -> None:
        self.events: list = []
        self.first_chunk = asyncio.Event()
        self.end_s = 0.0

    async def run(self, client: TokenyardClient, req: schemas.GenerateRequest) -> None:
        async for e in client.stream(req):
            self.events.append(e)
            if isinstance(e, schemas.Chunk):
                self.first_chunk.set()
        self.end_s = time.monotonic()

    @property
    def last(self):
        return self.events[-1]

    def seqs(self) -> list[int]:
        return [e.seq for e in self.events if isinstance(e, schemas.Chunk)]

    def tokens(self) -> int:
        return sum(len(e.token_ids) for e in self.events if isinstance(e, schemas.Chunk))


CLIENTS: list = []
"""The connections start_streams opened; stop_fleet closes those still open (a test that failed
before its own close would leave them reconnecting to its stopped server for the rest of the run)."""


async def start_streams(url: str, n: int, max_tokens: int, tapped_by: RouterShell | None = None):
    """`tapped_by`: a router that follows these streams on this client (as beside an edge in
    its process: services/router/follow.py) rather than by subscriptions of its own."""
    nc = await natsutil.connect(url, "fault-client")
    CLIENTS.append(nc)
    client = TokenyardClient(nc)
    if tapped_by is not None:
        tapped_by.follows.local = lambda: client
    recs = [Recorder() for _ in range(n)]
    tasks = [
        asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt=f"stream {i} " * 8, max_tokens=max_tokens)))
        for i, rec in enumerate(recs)
    ]
    async with asyncio.timeout(20):
        await asyncio.gather(*(r.first_chunk.wait() for r in recs))
    return nc, client, recs, tasks
