"""The queue's standing pull (services/priority_queue/shell.py `_pull_loop`): one pull request
at a time, renewed when its batch has all come and when it expires, so every stored message
reaches the core as it is stored, whatever the batch size and however long the queue idled."""

from __future__ import annotations

import asyncio
import json

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue import shell as queue_shell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer


async def held(nc) -> int:
    return json.loads((await nc.request("llm.v1.pq.stats", b"", timeout=2)).data)["held"]


async def submit_and_wait_held(n: int, fetch_batch: int, idle_s: float = 0.0) -> int:
    """Start admission and a queue (no router: the queue holds what it gets), idle `idle_s`,
    submit n requests; the number the queue holds once it stops growing within 10 s."""
    server = await natsutil.NatsServer().start()
    hosts = []
    try:
        hosts.append(await ServiceHost(AdmissionShell(AdmissionConfig(), ByteTokenizer()), server.url).start())
        hosts.append(await ServiceHost(QueueShell(QueueConfig(), FCFS(), fetch_batch=fetch_batch), server.url).start())
        nc = await natsutil.connect(server.url, "client")
        client = TokenyardClient(nc)
        await asyncio.sleep(idle_s)  # the idle time under test: pulls expire and are renewed meanwhile
        pending = [asyncio.create_task(client.generate(schemas.GenerateRequest(prompt=f"p{i}", max_tokens=1)))
                   for i in range(n)]
        got = 0
        try:
            async with asyncio.timeout(10):
                while (got := await held(nc)) < n:
                    await asyncio.sleep(0.02)
        except TimeoutError:
            pass
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await nc.close()
        return got
    finally:
        for h in reversed(hosts):
            await h.stop()
        server.stop()


async def test_a_pull_whose_batch_came_is_renewed_at_once(monkeypatch):
    # Pulls that never expire within the test: only a full batch can renew one.
    monkeypatch.setattr(queue_shell, "PULL_EXPIRES_S", 60.0)
    assert await submit_and_wait_held(7, fetch_batch=2) == 7


async def test_an_idle_queue_renews_its_expired_pulls_and_still_takes_the_next_message(monkeypatch):
    monkeypatch.setattr(queue_shell, "PULL_EXPIRES_S", 0.1)
    assert await submit_and_wait_held(3, fetch_batch=256, idle_s=0.6) == 3
