"""The same request asked for again is served once; a reused request id is a 409.

* an offer's answer or a route's answer lost: the request is served once, with no 409 and no
  deadline rejection;
* a reused request id gets 409 (from admission inside JetStream's dedup window, from the
  worker after it, and over HTTP with OpenAI's body), the first request runs on.
"""

from __future__ import annotations

import asyncio
import time

from tokenyard.services.priority_queue import shell as queue_shell
from tokenyard.services.router import shell as router_shell
from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient
from tokenyard.shared.service import ServiceHost

from tests.conftest import until
from tests.fault_fleet import CLIENTS, Recorder, start_fleet, start_streams, stop_fleet, worker


async def test_a_request_whose_offer_answer_came_late_is_served_once_without_a_409(monkeypatch):
    """The worker takes the request, but its answer reaches the router after the offer
    timeout (a worker cold-starting under load: bench/faults' queue-kill). The router's
    placement ends `unsure`, the queue asks again, the worker says it has it: one complete
    stream. Before: `no_capacity`, the queue routed it again, and the worker answered the
    same request with the reused-id 409 (63 of 1,200 in queue-kill)."""
    monkeypatch.setattr(router_shell, "OFFER_TIMEOUT_S", 0.3)
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=0, router=False)
    try:
        slow = worker("fw-slow")
        answer, generate, late, offers, generations = slow.on_generate, slow.generate, [], [], []

        async def counted(ar, *args) -> None:
            generations.append(ar.request_id)
            await generate(ar, *args)

        async def answer_the_first_offer_late(req) -> None:
            offers.append(req)
            if late:
                return await answer(req)

            class Late:  # the fault: this answer takes longer than the router waits
                data, headers = req.data, req.headers

                async def respond(self, data: bytes, headers=None) -> None:
                    await asyncio.sleep(0.6)
                    await req.respond(data, headers=headers)

            late.append(req)
            await answer(Late())

        slow.on_generate, slow.generate = answer_the_first_offer_late, counted
        hosts.insert(0, await ServiceHost(slow, server.url).start())
        hosts.append(await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start())
        await until(lambda: hosts[-1].shell.core.view.n == 1)
        nc, client, recs, tasks = await start_streams(server.url, 1, 200)
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        rec = recs[0]
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 200, rec.last
        assert rec.seqs() == list(range(len(rec.seqs())))
        assert not any(isinstance(e, schemas.Error) for e in rec.events)
        assert len(offers) >= 2 and len(generations) == 1  # asked again; generated once
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_placed_request_whose_route_answer_was_lost_is_not_expired_by_the_queue(monkeypatch):
    """The router places the request (its worker streams it) but its `routed` reaches the
    queue after the route timeout (lost in a NATS outage: bench/faults' nats-restart), past
    the request's TTFT deadline. The queue asks again instead of putting it back, the router
    answers `routed` from its placement, and the stream completes. Before: back in line,
    and `expire` ended a stream that a worker was sending with a 429 deadline_exceeded."""
    monkeypatch.setattr(queue_shell, "ROUTE_TIMEOUT_S", 0.3)
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1, router=False)
    try:
        router = RouterShell(RouterConfig(policy="least-loaded"))
        route, asks = router.serve_route, []

        async def answer_the_first_ask_late(req) -> None:
            asks.append(req)
            if len(asks) > 1:
                return await route(req)

            class Late:  # the fault: the answer comes after the queue stopped waiting
                data, headers = req.data, req.headers

                async def respond(self, data: bytes, headers=None) -> None:
                    await asyncio.sleep(1.0)
                    await req.respond(data, headers=headers)

                async def respond_error(self, *args, **kwargs) -> None:
                    await req.respond_error(*args, **kwargs)

            await route(Late())

        router.serve_route = answer_the_first_ask_late
        hosts.append(await ServiceHost(router, server.url).start())
        await until(lambda: router.core.view.n == 1)
        nc = await natsutil.connect(server.url, "fault-client")
        CLIENTS.append(nc)  # closed by stop_fleet should the test fail before its own close
        client = TokenyardClient(nc)
        rec = Recorder()
        # a 0.4 s TTFT target: its deadline passes while the queue waits for the lost answer
        await asyncio.wait_for(rec.run(client, schemas.GenerateRequest(
            prompt="placed " * 8, max_tokens=100, ttft_slo_ms=400.0)), 30)
        assert isinstance(rec.last, schemas.Finished) and rec.tokens() == 100, rec.last
        assert len(asks) >= 2  # asked again, answered from the placement
        await client.close()
        await nc.drain()
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_reused_request_id_gets_409_and_the_first_request_runs_on(fleet):
    client = TokenyardClient(fleet.nats)
    both = await asyncio.gather(*(
        client.generate(schemas.GenerateRequest(prompt=p, max_tokens=4, request_id="same")) for p in ("one", "two")
    ))
    refused = [d for d in both if d.rejected is not None]
    served = [d for d in both if d.finish_reason == "length"]
    assert len(refused) == 1 and len(served) == 1
    assert (refused[0].rejected.status, refused[0].rejected.code) == (409, "duplicate_request_id")
    assert refused[0].accepted is None and len(served[0].token_ids) == 4
    again = await client.generate(schemas.GenerateRequest(prompt="three", max_tokens=4, request_id="same"))
    assert again.rejected is not None and again.rejected.status == 409
    await client.close()


async def test_a_worker_answers_an_id_reused_past_the_dedup_window_with_409(fleet):
    """Past JetStream's window the queue would route a reused id again; the worker that ran
    the first one answers the newcomer's inbox with an error instead of leaving it waiting."""
    nc = fleet.nats
    client = TokenyardClient(nc)
    done = await client.generate(schemas.GenerateRequest(prompt="first", max_tokens=2, request_id="old-id"))
    wid = done.worker_id
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    ar = schemas.AdmittedRequest("old-id", inbox, config.DEFAULT_MODEL, [1, 2], 2, [], 16, 2, 1, time.time())
    reply = codec.decode((await nc.request(subjects.worker_generate(wid), codec.encode(ar), timeout=5)).data,
                         schemas.GenerateReply)
    assert reply.accepted and reply.reason == schemas.Outcome.DUPLICATE
    event = codec.decode_event((await sub.next_msg(timeout=5)).data)
    assert isinstance(event, schemas.Error) and event.status == 409
    await sub.unsubscribe()
    await client.close()


async def test_over_http_a_reused_x_request_id_is_a_409_with_an_openai_body(fleet):
    import aiohttp
    from tokenyard.services.edge.shell import EdgeConfig, EdgeShell

    host = await ServiceHost(EdgeShell(EdgeConfig(http_port=0)), fleet.nats_url).start()
    try:
        url = f"http://127.0.0.1:{host.shell.port}/v1/completions"
        body = {"model": config.DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body, headers={"x-request-id": "http-same"}) as r:
                assert r.status == 200
                await r.read()
            async with http.post(url, json=body, headers={"x-request-id": "http-same"}) as r:
                assert r.status == 409
                err = (await r.json())["error"]
        assert err["code"] == "duplicate_request_id" and "http-same" in err["message"]
    finally:
        await host.stop()
