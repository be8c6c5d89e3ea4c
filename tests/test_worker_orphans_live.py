"""A worker stops a request whose client is gone with no router at all (the one that placed it
may have died with the client: `tokenyard up`'s in-queue edge), and keeps the requests of a
client that is only silent (its probe times out) or answers its probe. Live: one worker on the
session's secured nats-server; three clients, each a connection of its own holding an inbox
subscription `_INBOX.<lease>.*`, offer long streams to the worker directly; one closes its
connection, and its request leaves the worker's running set within seconds, long before its
natural end."""

from __future__ import annotations

import asyncio
import time

from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.leases import ORPHAN_AFTER_S
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req
from tests.conftest import InProcFleet, until

TOKENS = 4000
"""Decoding 4,000 tokens on a100-llama3-8b at half speed takes over a minute."""


async def test_a_gone_clients_request_stops_on_its_worker_a_silent_or_answering_ones_runs_on(nats_server):
    fleet = InProcFleet(nats_server.url, None)
    engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=0.5)
    worker = (await fleet.add(WorkerShell(WorkerConfig("ow0", config.DEFAULT_MODEL), engine, ByteTokenizer()))).shell
    clients = {}
    try:
        for name, lease in (("gone", "0123456789abcdef"), ("silent", "00000000000000aa"),
                            ("answers", "00000000000000bb")):
            nc = await natsutil.connect(nats_server.url, f"orphan-client-{name}")
            got: list[schemas.StreamEvent] = []

            async def on_msg(msg, got=got, nc=nc, name=name):
                if msg.subject.endswith(".alive"):
                    if name == "answers" and msg.reply:
                        await nc.publish(msg.reply, b"")
                    return
                got.append(codec.decode_event(msg.data))

            await nc.subscribe(f"_INBOX.{lease}.*", cb=on_msg)
            ar = req(f"orphan-{name}", prompt_len=64, max_tokens=TOKENS, reply_to=f"_INBOX.{lease}.1",
                     model=config.DEFAULT_MODEL)
            reply = codec.decode((await nc.request(subjects.worker_generate("ow0"), codec.encode(ar), timeout=10)).data,
                                 schemas.GenerateReply)
            assert reply.accepted, reply
            clients[name] = (nc, got, ar)
        await until(lambda: all(got for _, got, _ in clients.values()), 30, what="every stream's first chunk")
        # past the first probe of every lease (a timeout or an answer: alive), then the client goes
        await until(lambda: worker.core.leases.probes >= 3 and not worker.core.leases.probing, 30,
                    what="each lease probed once and answered")
        assert set(worker.core.running_ids()) == {"orphan-gone", "orphan-silent", "orphan-answers"}
        gone_nc = clients["gone"][0]
        await gone_nc.close()  # the connection, and with it the `alive` subscription, is gone
        closed_s = time.monotonic()
        await until(lambda: "orphan-gone" not in worker.core.running_ids(), 8 * ORPHAN_AFTER_S, 0.05,
                    what="the gone client's request to stop")
        stopped_s = time.monotonic() - closed_s
        assert stopped_s < 8 * ORPHAN_AFTER_S
        # the others were probed again since (each probe after ORPHAN_AFTER_S): still running
        probes = worker.core.leases.probes
        await until(lambda: worker.core.leases.probes >= probes + 2 and not worker.core.leases.probing, 30,
                    what="the live leases probed once more")
        assert set(worker.core.running_ids()) == {"orphan-silent", "orphan-answers"}
        for name in ("silent", "answers"):
            got = clients[name][1]
            assert not any(isinstance(e, schemas.TERMINAL_EVENTS) for e in got), got[-1]
            assert sum(len(e.token_ids) for e in got if isinstance(e, schemas.Chunk)) < TOKENS
        # a redelivered copy of the orphan is refused (aborted), not run again
        _, _, ar = clients["gone"]
        reply = codec.decode((await clients["silent"][0].request(subjects.worker_generate("ow0"), codec.encode(ar),
                                                                  timeout=10)).data, schemas.GenerateReply)
        assert (reply.accepted, reply.reason) == (False, schemas.Outcome.ABORTED)
    finally:
        for nc, _, ar in clients.values():  # end the live streams: the worker's stop drains them
            if nc.is_connected:
                await nc.publish(subjects.ABORT, codec.encode(schemas.Abort(ar.request_id)))
                await nc.flush()
        await until(lambda: not worker.generating, 30, what="the streams to end")
        await fleet.stop()
        for nc, _, _ in clients.values():
            if not nc.is_closed:
                await nc.close()
        await asyncio.sleep(0)
