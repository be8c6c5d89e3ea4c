"""The worker's answer to an offer it took leaves with the request's first event
(services/worker/shell.py, `OfferAnswer`, REPLY_HOLD_S): published in the same turn of the loop,
just before it, so nats-py writes both at once — one write on the first token's path, where
the answer's own write came first. An engine whose first event is not near has the answer go
alone at the bound; a refusal is answered at once; a generation that ends with no event still
answers. Against a fake connection that records what is published, and in which turn."""

from __future__ import annotations

import asyncio

import pytest
from tokenyard.services.worker import shell as worker_shell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.shared import codec, schemas
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import MODEL, req
from tests.conftest import until
from tests.test_worker_outage import StepEngine


class Wire:
    """Publishes (the stream's events and the answer) with the loop turn each was made in."""

    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}
        self.turn = 0
        self.sent: list[tuple[int, str]] = []

    async def publish(self, subject: str, data: bytes, headers=None) -> None:
        self.sent.append((self.turn, type(codec.decode_event(data, headers)).__name__))

    async def count_turns(self) -> None:
        while True:
            self.turn += 1
            await asyncio.sleep(0)


class Offer:
    def __init__(self, ar: schemas.AdmittedRequest, wire: Wire) -> None:
        self.data, self.headers, self.wire = codec.encode(ar), None, wire
        self.reply: schemas.GenerateReply | None = None

    async def respond(self, data: bytes, headers=None) -> None:
        self.reply = codec.decode(data, schemas.GenerateReply)
        self.wire.sent.append((self.wire.turn, "answer"))


@pytest.fixture
async def worker():
    engine = StepEngine()
    shell = worker_shell.WorkerShell(WorkerConfig("w0", MODEL), engine, ByteTokenizer())
    shell.nc = wire = Wire()
    ticking = asyncio.create_task(wire.count_turns())
    yield shell, engine, wire
    ticking.cancel()


async def test_the_answer_leaves_in_the_first_events_turn_just_before_it(worker, monkeypatch):
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 5.0)
    shell, engine, wire = worker
    await shell.on_generate(offer := Offer(req("r1", max_tokens=1), wire))  # returns at once
    await asyncio.sleep(0.05)
    assert offer.reply is None and wire.sent == []  # held for the first event
    await engine.steps.put(EngineOutput("r1", [65], finished=True, finish_reason="length"))
    await until(lambda: not shell.generating)
    assert offer.reply == schemas.GenerateReply("r1", True)
    (t_answer, first), (t_chunk, second), (_, third) = wire.sent
    assert (first, second, third) == ("answer", "Chunk", "Finished") and t_answer == t_chunk  # one write


async def test_the_answer_goes_alone_when_the_first_event_is_not_near(worker, monkeypatch):
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 0.05)
    shell, engine, wire = worker
    await shell.on_generate(offer := Offer(req("r1", max_tokens=1), wire))
    await until(lambda: offer.reply is not None, timeout_s=1.0, what="the answer at the bound")
    assert offer.reply == schemas.GenerateReply("r1", True) and [what for _, what in wire.sent] == ["answer"]
    await engine.steps.put(EngineOutput("r1", [65], finished=True, finish_reason="length"))
    await until(lambda: not shell.generating)
    assert [what for _, what in wire.sent] == ["answer", "Chunk", "Finished"]  # answered once


async def test_a_refusal_is_answered_at_once_and_an_eventless_end_still_answers(worker, monkeypatch):
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 5.0)
    shell, engine, wire = worker
    shell.core.draining = True  # refuses every offer
    await shell.on_generate(refused := Offer(req("r0"), wire))
    assert refused.reply is not None and not refused.reply.accepted  # no hold for a refusal
    shell.core.draining = False
    await shell.on_generate(offer := Offer(req("r1"), wire))
    await engine.steps.put(None)  # the engine ends it before its first event (an abort)
    await until(lambda: offer.reply is not None, timeout_s=1.0, what="the answer as the generation ends")
    assert offer.reply == schemas.GenerateReply("r1", True)
