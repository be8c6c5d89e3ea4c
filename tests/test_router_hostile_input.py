"""A route request whose numbers the router's compiled kernels cannot take (a block size of
2⁶² overflows blocks · B in int64, a negative one makes a negative hit) is refused on
`llm.v1.route` with a 400 that names the field, on a real nats-server; the router routes the
next sane request as before."""

from __future__ import annotations

import pytest
from tokenyard.services.router.bounds import MAX_BLOCK_SIZE, check_inputs
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.shell import RouterShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from tests.builders import hb, req
from tests.conftest import until

HOSTILE = [
    (2**62, 4, 100, "block_size 4611686018427387904"),
    (0, 4, 100, "block_size 0"),
    (-5, 4, 100, "block_size -5"),
    (16, 4, -1, "prompt_len -1"),
    (MAX_BLOCK_SIZE, 2**25, 100, f"{2**25} blocks of {MAX_BLOCK_SIZE} tokens"),
]


@pytest.mark.parametrize(("block_size", "blocks", "prompt_len", "named"), HOSTILE)
def test_check_inputs_names_the_field(block_size, blocks, prompt_len, named):
    with pytest.raises(ValueError, match=named):
        check_inputs(req("r1", prompt_len=prompt_len, block_size=block_size, chain=[7] * blocks))


def test_the_core_refuses_before_its_kernels():
    core = RouterCore(RouterConfig(index_mode="approximate"))
    core.on_heartbeat(hb("w0"), 1.0)
    core.route(req("r0", prompt_len=100, chain=[1, 2, 3, 4]), 1.0)  # w0 now holds the chain (predicted)
    with pytest.raises(ValueError, match="block_size -5"):
        core.route(req("r1", prompt_len=100, block_size=-5, chain=[1, 2, 3, 4]), 1.0)  # main: hit -20 tokens
    with pytest.raises(ValueError, match="block_size 4611686018427387904"):
        core.route(req("r2", prompt_len=100, block_size=2**62, chain=[1, 2, 3, 4]), 1.0)  # main: TypeError
    assert core.route(req("r3", prompt_len=100, chain=[1, 2, 3, 4]), 1.0).hit_tokens == 64


async def test_route_endpoint_refuses_hostile_numbers_with_400(plain_nats):
    host = await ServiceHost(RouterShell(RouterConfig()), plain_nats.url).start()
    nc = await natsutil.connect(plain_nats.url, "test-hostile-route")
    try:
        await nc.publish(subjects.heartbeat("w0"), codec.encode(hb("w0", ts=0.0)))
        await until(lambda: "w0" in host.shell.core.view.ids, what="the router hears w0")
        for i, (block_size, blocks, prompt_len, named) in enumerate(HOSTILE[:4]):  # the 5th is no message's size
            bad = req(f"bad{i}", prompt_len=prompt_len, block_size=block_size, chain=[7] * blocks)
            reply = await nc.request(subjects.ROUTE, codec.encode(bad), timeout=3)  # main: no answer (timeout)
            assert reply.headers.get("Nats-Service-Error-Code") == "400", (named, reply.headers, reply.data)
            assert named in reply.headers.get("Nats-Service-Error"), reply.headers
        sane = req("sane", prompt_len=100, chain=[1, 2, 3])
        decision = codec.decode((await nc.request(subjects.ROUTE, codec.encode(sane), timeout=5)).data,
                                schemas.RouteDecision)
        assert decision.request_id == "sane"
        assert decision.outcome == schemas.Outcome.NO_CAPACITY  # w0 is a heartbeat, no worker: refused, answered
    finally:
        await nc.drain()
        await host.stop()
