"""SCORPIO's rejection path in a live worker: a WorkerShell on the session's real nats-server,
its simulated engine run by SCORPIO's policy on a real clock. A request the VBS check keeps
waiting past its TTFT deadline gets `rejected` 429 `deadline_exceeded` on its reply subject
(the engine's step loop calls SimEngineCore.expire, as the cluster simulator's tick does),
while the request it made way for keeps streaming."""

from __future__ import annotations

import asyncio
import time

from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import DEADLINE, EngineOutput, EngineStats
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders
from tests.conftest import InProcFleet

PROF = profile("a100-llama3-8b")


def admitted(rid: str, reply_to: str, max_tokens: int, deadline_s: float) -> AdmittedRequest:
    # 10 ms TPOT: one such request alone runs (an empty engine always admits), a second cannot
    # join it (two decodes take longer than 10 ms a step), so the VBS check keeps it waiting
    return builders.req(rid, 64, max_tokens, model=config.DEFAULT_MODEL, arrival_s=time.time(), reply_to=reply_to,
                        deadline_s=deadline_s, tpot_slo_ms=10.0)


class Inbox:
    """Every event published on one reply subject, in order; await the one you need."""

    def __init__(self) -> None:
        self.events: list[tuple[float, object]] = []
        self.changed = asyncio.Event()

    async def on_msg(self, msg) -> None:
        self.events.append((time.time(), codec.decode(msg.data, schemas.StreamEvent)))
        self.changed.set()

    async def first(self, kind: type, timeout_s: float = 10.0) -> tuple[float, object]:
        async with asyncio.timeout(timeout_s):
            while True:
                for t, e in self.events:
                    if isinstance(e, kind):
                        return t, e
                self.changed.clear()
                await self.changed.wait()


async def test_a_live_scorpio_worker_rejects_a_request_it_held_past_its_deadline(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-client")
    fleet = InProcFleet(nats_server.url, nc)
    engine = SimEngine(SimEngineCore(PROF, 16, policy=ScorpioPolicy(PROF)), speed=1.0)
    # Flow control off at the worker: its `saturated` refusal (no prefill a running decode's TPOT
    # slack cannot absorb) would turn B away at the door, which protects A the same way; here the
    # engine's own SCORPIO path — accept, hold, reject past the deadline — is what is tested.
    shell = WorkerShell(WorkerConfig("scorpio-w", config.DEFAULT_MODEL, flow_control=False), engine, ByteTokenizer())
    await fleet.add(shell)
    try:
        inbox_a, inbox_b = Inbox(), Inbox()
        subject_a, subject_b = nc.new_inbox(), nc.new_inbox()
        await nc.subscribe(subject_a, cb=inbox_a.on_msg)
        await nc.subscribe(subject_b, cb=inbox_b.on_msg)
        far = time.time() + 60.0
        a = admitted("run-a", subject_a, 2000, far)  # ~25 s of decoding: it runs throughout
        reply = await nc.request(subjects.worker_generate("scorpio-w"), codec.encode(a), timeout=5)
        assert codec.decode(reply.data, schemas.GenerateReply).accepted
        await inbox_a.first(schemas.Chunk)  # A is running
        deadline = time.time() + 2.0  # A runs for ~25 s more and no prefill fits beside it
        b = admitted("late-b", subject_b, 16, deadline)
        reply = await nc.request(subjects.worker_generate("scorpio-w"), codec.encode(b), timeout=5)
        assert codec.decode(reply.data, schemas.GenerateReply).accepted  # accepted, then held
        at, rejected = await inbox_b.first(schemas.Rejected)
        assert (rejected.request_id, rejected.status, rejected.code) == ("late-b", 429, "deadline_exceeded")
        assert at < deadline  # as soon as it is known (ttft_guard.py), not once the deadline has passed
        assert [type(e) for _, e in inbox_b.events] == [schemas.Rejected]  # no token, nothing after
        assert "late-b" not in engine.core.seqs and "late-b" not in shell.core.streams
        assert "run-a" in engine.core.seqs  # the running request is never rejected
        await nc.publish(subjects.ABORT, codec.encode(schemas.Abort("run-a")))
        _, done = await inbox_a.first(schemas.Finished)
        assert done.finish_reason == "abort"
    finally:
        await fleet.stop()
        await nc.drain()


def test_the_worker_core_turns_an_engine_deadline_rejection_into_a_429():
    core = WorkerCore(WorkerConfig("w1", "m"), ByteTokenizer())
    stats = EngineStats(running=0, waiting=0, queued_prefill_tokens=0, kv_blocks_used=0, kv_blocks_free=100,
                        block_size=16)
    req = builders.req("r1", 64, 8, 1, arrival_s=100.0, reply_to="inbox", deadline_s=102.5)
    assert core.offer(req, stats)[1]
    (event,) = core.on_output(EngineOutput("r1", [], True, DEADLINE, 0))
    assert isinstance(event, schemas.Rejected)
    assert (event.request_id, event.status, event.code) == ("r1", 429, "deadline_exceeded")
    assert "2.5 s" in event.message and core.streams == {}
    # a request that already streamed tokens is never "rejected": `deadline` only ends unstarted ones
    assert core.offer(builders.req("r2", 64, 8, 1, arrival_s=100.0, reply_to="inbox"), stats)[1]
    core.on_output(EngineOutput("r2", [104]))
    events = core.on_output(EngineOutput("r2", [], True, DEADLINE, 0))
    assert isinstance(events[-1], schemas.Finished)
