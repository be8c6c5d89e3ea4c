"""WorkerCore's side of migration and of reused ids: a resumed request runs as prompt + the
tokens already sent, numbers its chunks on, and counts usage as one request; a `migrated`
abort silences a stream without ending it for the client; an id reused with another reply
subject gets a 409, a redelivery with the same one does not."""

from __future__ import annotations

import msgspec
from tokenyard.services.worker.core import WorkerConfig, WorkerCore, engine_request
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.shared.schemas import (
    MIGRATED,
    REOFFERED,
    AdmittedRequest,
    Chunk,
    Error,
    Finished,
    GenerateReply,
    Outcome,
    Usage,
)
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders

STATS = builders.stats(free=100)


def req(rid: str = "r1", reply_to: str = "inbox.a", **kw) -> AdmittedRequest:
    return msgspec.structs.replace(builders.req(rid, tokens=[1, 2, 3], chain=[7], max_tokens=6, reply_to=reply_to), **kw)


def core() -> WorkerCore:
    return WorkerCore(WorkerConfig("w1", "m"), ByteTokenizer())


def test_the_engine_runs_prompt_plus_resumed_tokens_for_the_remaining_budget():
    r = req(resume_token_ids=[104, 105], resume_seq=2, migrations=1)
    e = engine_request(r)
    assert (e.prompt_token_ids, e.prompt_len, e.max_tokens, e.block_hashes) == ([1, 2, 3, 104, 105], 5, 4, [7])
    replay = engine_request(req(prompt_token_ids=[], resume_token_ids=[9], migrations=1))
    assert (replay.prompt_token_ids, replay.prompt_len, replay.max_tokens) == ([], 4, 5)
    assert engine_request(req()) == req()


def test_a_resumed_stream_continues_the_seqs_and_counts_usage_as_one_request():
    c = core()
    r = req(resume_token_ids=[104, 105], resume_seq=2, migrations=1)
    assert c.offer(r, STATS) == (GenerateReply("r1", True), True)
    assert c.on_output(EngineOutput("r1", [106])) == [Chunk("r1", 2, "j", [106], worker_id="w1")]  # names its worker
    events = c.on_output(EngineOutput("r1", [107], True, "length"))
    assert events == [Chunk("r1", 3, "k", [107]), Finished("r1", 4, "length", Usage(3, 4, 7), "w1")]


def test_a_migrated_abort_silences_the_stream_and_keeps_the_id_open():
    c = core()
    c.offer(req(), STATS)
    assert c.on_abort("r1", MIGRATED) is True
    assert c.running_ids() == []
    assert c.on_output(EngineOutput("r1", [104])) == []
    assert c.on_output(EngineOutput("r1", [], True, "abort")) == []  # no `finished abort` to the client
    assert c.streams == {}
    # a later re-issue here (migrations grew) is a new generation, not a duplicate
    assert c.offer(req(migrations=1, resume_token_ids=[104], resume_seq=1), STATS) == (GenerateReply("r1", True), True)


def test_a_client_abort_still_refuses_the_id():
    c = core()
    assert c.on_abort("r1") is False
    assert c.offer(req(), STATS) == (GenerateReply("r1", False, Outcome.ABORTED), False)


def test_a_reused_id_gets_409_and_a_redelivery_stays_a_silent_duplicate():
    c = core()
    c.offer(req(), STATS)
    reply, start = c.offer(req(), STATS)
    assert (reply, start) == (GenerateReply("r1", True, REOFFERED), False)
    assert reply.reason != Outcome.DUPLICATE  # the shell sends a 409 on DUPLICATE only
    reply, start = c.offer(req(reply_to="inbox.b"), STATS)
    assert (reply, start) == (GenerateReply("r1", True, Outcome.DUPLICATE), False)
    assert reply.reason != REOFFERED
    assert c.reused_id_error(req(reply_to="inbox.b")) == Error("r1", 409, "request id 'r1' is already in use")
    assert c.running_ids() == ["r1"]
