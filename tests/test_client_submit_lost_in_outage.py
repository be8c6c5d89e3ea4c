"""A submit published as the nats-server went away (shared/client.py, RECONNECT_RESUBMIT_S): no
admission ever saw it, and nothing else answers it. Before, its stream ended RECONNECT_GRACE_S
after the reconnect with an `error` 503 "events lost while NATS reconnected" (bench chaos-style
repro: the first submit after a server stop, 1 of 10, every run); the client now sends it again,
marked, soon after the reconnect.

Real nats-server, stopped and started on its port. Admission is a plain subscription on
`llm.v1.submit` that never answers an unmarked submit (the first, lost) and answers the marked
resend with a 429 naming itself."""

from __future__ import annotations

import asyncio

from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.client import RECONNECT_GRACE_S, RECONNECT_RESUBMIT_S, TokenyardClient

from tests.conftest import until


async def test_a_submit_lost_with_the_connection_is_sent_again_soon_after_the_reconnect():
    server = await natsutil.NatsServer().start()
    admission = await natsutil.connect(server.url, "admission")
    heard: list[bool] = []

    async def answer(msg) -> None:
        resend = subjects.RESUBMIT_HEADER in (msg.headers or {})
        heard.append(resend)
        if resend:  # the first is lost: only the resend is answered
            rid = codec.decode(msg.data, schemas.GenerateRequest).request_id
            await admission.publish(msg.reply, codec.encode(schemas.Rejected(rid, 429, "heard", "heard the resend")),
                                    headers={subjects.RESUBMIT_HEADER: "1"})

    try:
        await admission.subscribe(subjects.SUBMIT, cb=answer)
        await admission.flush()
        client = TokenyardClient(await natsutil.connect(server.url, "client"))
        result = asyncio.create_task(client.generate(schemas.GenerateRequest(prompt="lost", max_tokens=2,
                                                                             request_id="r1")))
        await until(lambda: heard == [False], what="the first submit reached admission (which drops it)")
        server.stop()
        await until(lambda: not client.nc.is_connected, what="the client saw the server go")
        await server.start()
        await until(lambda: client.nc.is_connected and admission.is_connected, what="both back")
        back = asyncio.get_running_loop().time()
        out = await asyncio.wait_for(result, RECONNECT_GRACE_S + 5)
        took = asyncio.get_running_loop().time() - back
        assert out.rejected is not None and out.rejected.message == "heard the resend", out
        assert heard == [False, True]
        assert took < RECONNECT_GRACE_S - 2, took  # the resend, RECONNECT_RESUBMIT_S after the reconnect
        assert took >= RECONNECT_RESUBMIT_S - 1.0, took  # (the client checks once a second)
        await client.close()
        await client.nc.drain()
    finally:
        await admission.close()
        server.stop()
