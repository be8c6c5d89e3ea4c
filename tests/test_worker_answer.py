"""The worker's answer to an offer it took leaves right behind the request's first token
(services/worker/shell.py, `OfferAnswer`, REPLY_HOLD_S): the first token is written to the
socket at once and alone (nats_internals.send_now), not on nats-py's flusher's turn behind the rest
of the engine's step, and the answer follows in that same turn of the loop, into the buffer
the flusher writes — on the first token's path there is no write, and no reading by the router,
of the answer first. An engine whose first event is not near has the answer go alone at the
bound; a refusal is answered at once; a generation that ends with no event still answers.
Against a fake connection that records what is published, and in which turn."""

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


async def test_the_answer_leaves_in_the_first_tokens_turn_just_after_it(worker, monkeypatch):
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 5.0)
    shell, engine, wire = worker
    await shell.on_generate(offer := Offer(req("r1", max_tokens=1), wire))  # returns at once
    await asyncio.sleep(0.05)
    assert offer.reply is None and wire.sent == []  # held for the first event
    await engine.steps.put(EngineOutput("r1", [65], finished=True, finish_reason="length"))
    await until(lambda: not shell.generating)
    assert offer.reply == schemas.GenerateReply("r1", True)
    (t_chunk, first), (t_answer, second), (_, third) = wire.sent
    assert (first, second, third) == ("Chunk", "answer", "Finished") and t_answer == t_chunk  # one turn


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


class Buffered(Wire):
    """nats-py's buffering: a publish waits in `_pending` until a write — its flusher's, on a
    later turn (`flush_each_turn`), or `nats_internals.send_now`'s, at once. `writes`: what each
    write carried."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[str] = []
        self._pending_data_size = 0
        self._transport = self
        self.writes: list[list[str]] = []

    async def publish(self, subject: str, data: bytes, headers=None) -> None:
        self._pending.append(type(codec.decode_event(data, headers)).__name__)

    def writelines(self, items) -> None:
        self.writes.append(list(items))

    async def flush_each_turn(self) -> None:
        while True:
            await asyncio.sleep(0)
            if self._pending:
                self.writelines(self._pending)
                self._pending = []


class BufferedOffer(Offer):
    async def respond(self, data: bytes, headers=None) -> None:  # on the worker's connection, as nats.micro's
        self.reply = codec.decode(data, schemas.GenerateReply)
        self.wire._pending.append("answer")


async def test_the_first_token_is_written_at_once_alone_the_answer_and_the_rest_on_the_flushers_turn(monkeypatch):
    """An engine step that makes the first token and more in one go (here: both tokens and the
    end, ready at once): the first chunk leaves in a write of its own, made in its turn; the
    answer and what the step makes after it wait for nats-py's flusher."""
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 5.0)
    engine = StepEngine()
    shell = worker_shell.WorkerShell(WorkerConfig("w0", MODEL), engine, ByteTokenizer())
    shell.nc = wire = Buffered()
    flushing = asyncio.create_task(wire.flush_each_turn())
    try:
        await engine.steps.put(EngineOutput("r1", [65]))
        await engine.steps.put(EngineOutput("r1", [66], finished=True, finish_reason="length"))
        await shell.on_generate(offer := BufferedOffer(req("r1", max_tokens=2), wire))
        await until(lambda: not shell.generating and not wire._pending)
        assert offer.reply == schemas.GenerateReply("r1", True)
        assert wire.writes == [["Chunk"], ["answer", "Chunk", "Finished"]]
    finally:
        flushing.cancel()


class Recording(StepEngine):
    """A StepEngine that notes each request as it reaches the engine."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []

    async def generate(self, req):
        self.started.append(req.request_id)
        async for out in super().generate(req):
            yield out


async def test_an_accepted_offer_reaches_the_engine_before_its_handler_returns(monkeypatch):
    """The generation's first step runs in the offer's turn (shared/eager.py), not on a later
    turn of the loop behind whatever else is queued: the engine has the request at once."""
    monkeypatch.setattr(worker_shell, "REPLY_HOLD_S", 5.0)
    engine = Recording()
    shell = worker_shell.WorkerShell(WorkerConfig("w0", MODEL), engine, ByteTokenizer())
    shell.nc = wire = Wire()
    await shell.on_generate(Offer(req("r1", max_tokens=1), wire))
    assert engine.started == ["r1"] and shell.generating
    await engine.steps.put(EngineOutput("r1", [65], finished=True, finish_reason="length"))
    await until(lambda: not shell.generating)
    assert [what for _, what in wire.sent] == ["Chunk", "answer", "Finished"]
