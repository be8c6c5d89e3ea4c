"""A stream that breaks ends with an error, never a short `finished`; a client that vanishes
has its generation aborted, one that is merely late keeps it.

* a gap in a stream, or a silent stream, ends with an error;
* a client that vanishes (no abort, its lease lapses) has its generation aborted;
* a client that is late but still connected keeps its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tokenyard.shared import codec, natsutil, schemas, stream_check, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.fault_fleet import Recorder, start_fleet, stop_fleet


async def _fake_admission(nc, events) -> None:
    """Answer every submit with the given events, in order."""

    async def answer(msg) -> None:
        for e in events:
            await nc.publish(msg.reply, codec.encode(e))

    await nc.subscribe(subjects.SUBMIT, queue=subjects.GROUP_ADMISSION, cb=answer)


async def test_a_gap_in_the_stream_is_an_error_not_a_short_finish(monkeypatch):
    monkeypatch.setattr(stream_check, "GAP_WAIT_S", 1.0)  # the shipped wait is 15 s
    server = await natsutil.NatsServer().start()
    try:
        nc = await natsutil.connect(server.url, "fake")
        usage = schemas.Usage(3, 3, 6)
        await _fake_admission(nc, [schemas.Accepted("g", 1, 3), schemas.Chunk("g", 0, "a", [97]),
                                   schemas.Chunk("g", 2, "c", [99]), schemas.Finished("g", 3, "length", usage)])
        out = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="x", request_id="g"))
        assert out.finish_reason is None and out.error is not None and out.error.status == 502
        assert out.text == "a"
        await nc.drain()
    finally:
        server.stop()


async def test_a_silent_stream_ends_with_an_error_after_the_idle_timeout():
    server = await natsutil.NatsServer().start()
    try:
        nc = await natsutil.connect(server.url, "fake")
        aborts: list[str] = []


        async def on_abort(msg) -> None:
            aborts.append(codec.decode(msg.data, schemas.Abort).reason)

        await nc.subscribe(subjects.ABORT, cb=on_abort)
        await _fake_admission(nc, [schemas.Accepted("s", 1, 3), schemas.Chunk("s", 0, "a", [97])])
        out = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="x", request_id="s"), idle_timeout_s=0.3)
        assert out.error is not None and out.error.status == 504 and out.text == "a"
        await nc.flush()
        await until(lambda: aborts == ["client_idle_timeout"])
        await nc.drain()
    finally:
        server.stop()


async def test_a_vanished_clients_generation_is_aborted():
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1)
    try:
        gone = await natsutil.connect(server.url, "doomed-client")
        client = TokenyardClient(gone)
        rec = Recorder()
        task = asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt="long", max_tokens=5000)))
        await asyncio.wait_for(rec.first_chunk.wait(), 20)
        w = hosts[0].shell
        assert len(w.core.running_ids()) == 1
        client._lease_task.cancel()  # the client dies: no abort, no more lease (a fault: no public way)
        await gone.close()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        t0 = time.monotonic()
        await until(lambda: not w.core.streams, timeout_s=10)
        assert time.monotonic() - t0 < 6.0  # orphan_after_s (3 s) + a tick, not the 5000 tokens
        assert w.engine.stats().running == 0  # the engine stopped it too, not only the worker's bookkeeping
    finally:
        await stop_fleet(hosts)
        server.stop()


async def test_a_late_but_connected_clients_generation_lives_on():
    """A client whose lease falls silent while its connection stays (a stalled event loop: the
    overload probe's edge, 3.7 s late) is probed, not aborted; once it is really gone, it is."""
    server = await natsutil.NatsServer().start()
    hosts = await start_fleet(server.url, workers=1)
    try:
        nc = await natsutil.connect(server.url, "stalled-client")
        client = TokenyardClient(nc)
        rec = Recorder()
        task = asyncio.create_task(rec.run(client, schemas.GenerateRequest(prompt="long", max_tokens=5000)))
        await asyncio.wait_for(rec.first_chunk.wait(), 20)
        w = hosts[0].shell
        running = w.core.running_ids()
        assert len(running) == 1
        client._lease_task.cancel()  # the lease stops: a stalled loop from outside (a fault: no public way)
        with contextlib.suppress(asyncio.CancelledError):
            await client._lease_task
        probes: list[str] = []

        async def probed(msg) -> None:
            probes.append(msg.subject)

        prefix = nc.new_inbox().rsplit(".", 1)[0]
        await nc.subscribe(f"{prefix}.{client.lease_id}.alive", cb=probed)  # …while its connection stays
        await until(lambda: len(probes) >= 3, timeout_s=15)  # 3 s of silence, then a probe every 0.5 s
        assert w.core.running_ids() == running
        await nc.close()  # now it is gone: the next probe finds no responders
        t0 = time.monotonic()
        await until(lambda: not w.core.streams, timeout_s=10)
        assert time.monotonic() - t0 < 2.0  # a probe interval and a tick, not stalled_client_s
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    finally:
        await stop_fleet(hosts)
        server.stop()
