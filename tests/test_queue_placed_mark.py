"""The placed mark (subjects.PLACED_HEADER) only on a copy whose route has answered ROUTED. A
queue with admission but its router in another process (`tokenyard queue --with-admission`
without `--with-router`) used to resolve the hand-over as routed as soon as its route ask left:
the copy was stored marked placed before any worker had it, another replica acked it, and when
the taker then died the admitted request was lost (found in review; this test lost it)."""

from __future__ import annotations

import asyncio

from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import schemas
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import TOK, stop_fleet
from tests.test_queue_replicas_handover import two_workers


async def test_a_copy_whose_route_has_not_answered_is_placed_by_another_replica_once_its_taker_dies(nats_server):
    url = nats_server.url
    workers, hosts = await two_workers(url)
    b_router = RouterShell(RouterConfig(policy="least-loaded"))
    a = QueueShell(QueueConfig(), FCFS(), router=None)  # asks llm.v1.route over NATS
    b = QueueShell(QueueConfig(), FCFS(), router=b_router)

    async def never_pulls() -> None:
        return None

    a._pull_loop = never_pulls  # its copy reaches `b` (a fault set-up: no public way)
    real, asked, release = b_router.serve_route, [], asyncio.Event()

    async def first_never_answered(req) -> None:
        asked.append(req)
        if len(asked) == 1:
            await release.wait()  # `a`'s route ask: the router answers it only once the test ends
            return
        await real(req)

    b_router.serve_route = first_never_answered
    admission = AdmissionShell(AdmissionConfig(), TOK, queue=a)
    a_hosts = [await ServiceHost(shell, url).start() for shell in (a, admission)]
    hosts += [await ServiceHost(shell, url).start() for shell in (b_router, b)]
    ids = {w.core.cfg.worker_id for w in workers}
    await until(lambda: ids <= set(b_router.core.view.ids) and ids <= set(a.core.workers)
                and ids <= set(admission.core.fleet.workers) and a.instance_id in b.peers)
    client = await TokenyardClient.connect(url)
    done = asyncio.create_task(client.generate(schemas.GenerateRequest(prompt="orphan", max_tokens=5)))
    try:
        await until(lambda: asked and not admission.handing_over, what="stored, its route unanswered")
        for h in a_hosts:  # `a`'s process dies: its connection goes, nothing finished (a fault set-up)
            h._stopped.set()
            for t in [*a._tasks, *a._routes]:
                t.cancel()
            await h.nc.close()
        got = await asyncio.wait_for(done, 15)  # `b` places the copy once `a` is silent
        assert got.finish_reason == "length" and len(got.token_ids) == 5, got
    finally:
        release.set()
        done.cancel()
        await client.close()
        await stop_fleet(hosts)
