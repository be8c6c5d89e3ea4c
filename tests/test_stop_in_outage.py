"""A stop while the bus is gone (shared/service.py BUS_GONE_S), in the queue's process as `tokenyard
up` runs it (router, queue, admission, the HTTP edge). Its path to nats-server is cut
(tests/silent_proxy.py) the way a partition cuts it — no FIN; each reconnect attempt hangs on a
silent address, its connection CONNECTING, not RECONNECTING, for up to natsutil.ATTEMPT_TIMEOUT_S:
before, the bus cut never came, and the client waited 21 s for the store's 503 — or the way a
server gone does (connections refused: before, the client hung with its 200 until the process
ended, no error at all).

A request the edge takes in the outage is admitted and handed to the queue by a call: its client
has `accepted` (an SSE 200) while its JetStream store waits in the connection. The stop must
neither leave that client holding a 200 for a request no queue will see — its stream cut short,
or hanging — nor keep it waiting for the store's own deadline (natsutil.SUBMIT_ANSWER_S, 22 s):
it gets an error it can send again on, within the bus cut of the edge and of admission, and
nothing of it is stored (no run for a client told to send it again)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from tokenyard.shared import natsutil, subjects
from tokenyard.shared.service import BUS_GONE_S, CUT_OFF_S, ServiceHost

from tests.conftest import stop_hosts, until
from tests.fault_fleet import worker
from tests.silent_proxy import SilentProxy
from tests.test_edge_in_queue import start_front


@pytest.mark.parametrize("outage", ["partition", "refused"])
async def test_a_request_accepted_in_an_outage_is_told_to_send_again_when_its_process_stops(plain_nats, outage):
    nc = await natsutil.connect(plain_nats.url, "observer")
    await natsutil.ensure_queue_stream(nc)
    js = nc.jetstream()
    await js.purge_stream(subjects.QUEUE_STREAM)
    proxy = await SilentProxy(plain_nats.port).start()
    hosts = [await ServiceHost(worker("ow0"), plain_nats.url).start()]
    stopping = None
    try:
        front = await start_front(proxy.url)
        hosts += front.hosts
        await until(lambda: "ow0" in front.router.core.view.ids and "ow0" in front.admission.core.fleet.workers)
        await proxy.cut(reset=True, refuse=outage == "refused")
        await until(lambda: not any(h.nc.is_connected for h in front.hosts), what="the front cut off")
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as http:
            body = {"model": "tokenyard-sim", "prompt": "in the outage", "max_tokens": 5, "stream": True}
            async with http.post(f"{front.url}/v1/completions", json=body, headers={"x-request-id": "out1"}) as resp:
                assert resp.status == 200  # accepted, by a call: its store waits in admission's connection
                assert front.admission.handing_over == ["out1"]
                stopped = loop.time()
                stopping = asyncio.ensure_future(stop_hosts(front.hosts))  # as `tokenyard queue` stops them
                async with asyncio.timeout(2 * BUS_GONE_S + CUT_OFF_S + 3):  # the edge's cut, then admission's
                    lines = [ln.decode().strip() async for ln in resp.content if ln.strip()]
                took = loop.time() - stopped
        assert lines[-1] == "data: [DONE]", lines
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert error["type"] == "server_error" and error["message"].startswith("not queued"), error
        assert took >= 2 * BUS_GONE_S - 0.5, took  # not before the bus cuts: a bus back within them stores it
        await stopping
        await proxy.heal()  # nothing of it is left to reach the bus
        # a connection the stop left open would be back by now, its attempt on the silent address given up
        await asyncio.sleep(natsutil.RECONNECT_BOUND_S)  # (no state to await)
        assert (await js.stream_info(subjects.QUEUE_STREAM)).state.messages == 0
        assert prompt_tokens(hosts[0].shell) == 0  # the router's offer, left in its connection, never left
    finally:
        if stopping is None:
            await stop_hosts(hosts[1:])
        await stop_hosts(hosts[:1])
        await proxy.stop()
        await nc.close()


def prompt_tokens(shell) -> float:
    """The prompt tokens a worker prefilled: any request that reached its engine counts."""
    return sum(s.value for m in shell.metrics.registry.collect() if m.name == "vllm:prompt_tokens"
               for s in m.samples if s.name.endswith("_total"))
