"""Admission of a client's resume (services/admission/resume.py): the pure checks, and live on
the session's secured nats-server, once per request id and lease (JetStream's duplicate
check), whichever replica gets it, a refusal changing nothing."""

from __future__ import annotations

import asyncio

import pytest
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.resume import resumed
from tokenyard.shared import codec, config, natsutil, schemas, subjects
from tokenyard.shared.resume import ResumeAsk
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.conftest import until

LEASE = "0123456789abcdef"
OTHER = "fedcba9876543210"


def ask(rid: str = "r-1", was: str = f"_INBOX.{LEASE}.1aa", tokens=(7, 8, 9), seq: int = 3,
        max_tokens: int = 16) -> ResumeAsk:
    req = schemas.GenerateRequest(model=config.DEFAULT_MODEL, prompt="hello there", max_tokens=max_tokens,
                                  request_id=rid or None)
    return ResumeAsk(req, was, list(tokens), seq)


def judge(a: ResumeAsk, reply_to: str = f"_INBOX.{LEASE}.2bb"):
    return resumed(AdmissionCore(AdmissionConfig(slo_check=False), ByteTokenizer()), a, reply_to, None, 100.0)


def test_a_resume_is_admitted_with_its_tokens_and_the_seq_it_continues_from():
    out = judge(ask())
    assert isinstance(out, schemas.AdmittedRequest), out
    assert (out.request_id, out.reply_to) == ("r-1", f"_INBOX.{LEASE}.2bb")
    assert (out.resume_token_ids, out.resume_seq, out.migrations) == ([7, 8, 9], 3, 1)
    assert out.max_tokens == 16 and out.prompt_len == len("hello there")


@pytest.mark.parametrize("a, reply_to, why", [
    (ask(rid=""), f"_INBOX.{LEASE}.2bb", "names the request id"),
    (ask(was=f"_INBOX.{OTHER}.1aa"), f"_INBOX.{LEASE}.2bb", "a new inbox of the lease"),
    (ask(), f"_INBOX.{OTHER}.2bb", "a new inbox of the lease"),
    (ask(was="_INBOX.nolease"), "_INBOX.nolease2", "a new inbox of the lease"),
    (ask(), f"_INBOX.{LEASE}.1aa", "a new inbox of the lease"),  # the old inbox again
    (ask(seq=0, tokens=()), f"_INBOX.{LEASE}.2bb", "after its first chunk"),
    (ask(tokens=range(16), seq=16), f"_INBOX.{LEASE}.2bb", "nothing is left"),
], ids=["no-id", "other-lease-old", "other-lease-new", "no-lease", "same-inbox", "no-chunk", "all-came"])
def test_a_resume_that_cannot_be_the_leases_own_or_has_nothing_left_is_refused(a, reply_to, why):
    out = judge(a, reply_to)
    assert isinstance(out, schemas.Rejected) and out.status == 400 and out.code == "resume_refused", out
    assert why in out.message


def test_a_resume_is_judged_as_any_request():
    out = judge(ask(max_tokens=-1))
    assert isinstance(out, schemas.Rejected) and out.status == 400 and out.param == "max_tokens", out


async def test_a_resume_is_admitted_once_per_id_and_lease_and_streams_on_from_its_seq(fleet):
    """The first resume streams the rest, numbered on from its seq, and counts the resumed tokens
    as completion tokens; the same resume again is refused 409 and nothing more runs; another
    lease's resume of the id is its own (another message id)."""
    nc = await natsutil.connect(fleet.nats_url, "resume-test")  # the operator: may read these inboxes
    got: dict[str, list[schemas.StreamEvent]] = {}

    async def on_event(msg):
        got.setdefault(msg.subject, []).append(codec.decode_event(msg.data, msg.headers))

    try:
        await nc.subscribe("_INBOX.*.*", cb=on_event)
        await nc.flush()
        first, again, other = f"_INBOX.{LEASE}.2bb", f"_INBOX.{LEASE}.3cc", f"_INBOX.{OTHER}.4dd"
        await nc.publish(subjects.RESUME, codec.encode(ask(rid="once-1")), reply=first)
        await until(lambda: got.get(first) and isinstance(got[first][-1], schemas.Finished), 20,
                    what="the resumed stream's end")
        events = got[first]
        assert isinstance(events[0], schemas.Accepted)
        chunks = [e for e in events if isinstance(e, schemas.Chunk)]
        assert [c.seq for c in chunks] == list(range(3, 3 + len(chunks)))
        assert sum(len(c.token_ids) for c in chunks) == 16 - 3
        assert chunks[0].worker_id in {"tw0", "tw1"} and chunks[0].accepted is None
        end = events[-1]
        assert end.seq == 3 + len(chunks) and end.usage.completion_tokens == 16
        await nc.publish(subjects.RESUME, codec.encode(ask(rid="once-1")), reply=again)
        await until(lambda: got.get(again), 10, what="the second resume's answer")
        await asyncio.sleep(0.5)  # anything it would have run would stream by now
        assert len(got[again]) == 1, got[again]
        refusal = got[again][0]
        assert isinstance(refusal, schemas.Rejected) and refusal.status == 409, refusal
        assert "resumed already" in refusal.message
        await nc.publish(subjects.RESUME, codec.encode(ask(rid="once-1", was=f"_INBOX.{OTHER}.1aa")), reply=other)
        await until(lambda: any(isinstance(e, schemas.TERMINAL_EVENTS) for e in got.get(other, [])), 20,
                    what="the other lease's resume")
        ends = [e for e in got[other] if isinstance(e, schemas.TERMINAL_EVENTS)]
        assert any(isinstance(e, schemas.Accepted) for e in got[other])  # admission's duplicate check: not 409
        # placed on the worker that ran the id, that worker refuses a reused id (its 409 may
        # overtake admission's `accepted`); on the other one it runs, for that lease alone
        assert ends == [ends[0]] and (isinstance(ends[0], schemas.Finished)
                                      or (isinstance(ends[0], schemas.Error) and ends[0].status == 409)), got[other]
    finally:
        await nc.drain()
