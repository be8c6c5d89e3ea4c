"""A crash of the priority queue loses no admitted request: the requests it held unacked
are redelivered by JetStream to the replica that takes over, and every client still gets
its tokens."""

from __future__ import annotations

import asyncio
import contextlib
import json

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import until


async def crash(host: ServiceHost) -> None:
    """Die without a word: no acks, no naks, the connection just goes (in process: a service has,
    by design, no public way to, so this reaches into its shell)."""
    host.shell._running = False
    for t in host.shell._tasks:
        t.cancel()
    with contextlib.suppress(Exception):
        await host.nc.close()


async def test_queue_crash_loses_no_admitted_request():
    server = await natsutil.NatsServer().start()
    hosts = []
    try:
        url = server.url
        tok = ByteTokenizer()
        for shell in (AdmissionShell(AdmissionConfig(), tok), RouterShell(RouterConfig())):
            hosts.append(await ServiceHost(shell, url).start())
        qcfg = QueueConfig(ack_wait_s=1.0)
        first = await ServiceHost(QueueShell(qcfg, FCFS()), url).start()

        nc = await natsutil.connect(url, "client")
        client = TokenyardClient(nc)
        # No worker yet: the queue admits and holds every request.
        pending = [
            asyncio.create_task(client.generate(schemas.GenerateRequest(prompt=f"keep me {i}", max_tokens=2)))
            for i in range(5)
        ]
        async def all_held() -> bool:
            return json.loads((await nc.request("llm.v1.pq.stats", b"", timeout=2)).data)["held"] >= 5

        await until(all_held, timeout_s=30, poll_s=0.02)
        await crash(first)

        hosts.append(await ServiceHost(QueueShell(qcfg, FCFS()), url).start())
        engine = SimEngine(SimEngineCore(profile("zero")))
        hosts.append(await ServiceHost(WorkerShell(WorkerConfig("w-late", "tokenyard-sim"), engine, tok), url).start())

        done = await asyncio.wait_for(asyncio.gather(*pending), timeout=20)
        assert [d.finish_reason for d in done] == ["length"] * 5
        assert all(d.accepted is not None and d.usage.completion_tokens == 2 for d in done)
        # Every message is acked once routed (acks are asynchronous publishes: await them).
        async def stream_empty() -> bool:
            return (await nc.jetstream().stream_info("LLM_QUEUE")).state.messages == 0

        await until(stream_empty, timeout_s=5)
        await nc.drain()
    finally:
        for h in reversed(hosts):
            await h.stop()
        server.stop()
