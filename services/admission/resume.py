"""Admission of a client's resume (shared/resume.py): its stream's worker is gone and nobody
else moved it, so its client asks for the rest, once, on a new inbox.

    resumed(core, ask, reply_to, headers, now) → AdmittedRequest | Rejected      pure
        refused 400 `resume_refused` unless: the request names its id; the old and the new
        inbox are two inboxes of one lease (only that lease's holder can read either: the
        server lets a client subscribe only below its own inbox prefix); at least one chunk
        came (`next_seq` ≥ 1, tokens given) and fewer tokens than the request's max_tokens;
        then judged as any request (validation, tenant, rate, SLO feasibility: an overloaded
        fleet refuses a resume as it refuses a new request), and the admitted request carries
        resume_token_ids / resume_seq, migrations 1.
    on_resume(shell, msg)                                                       the shell
        into JetStream (admission's own `store`: retried through a failover) with Nats-Msg-Id
        `<id>.resume.<lease>`: the stream's duplicate check
        admits one resume per request id and lease (within its 120 s window, far longer than
        a client waits), whichever admission replica gets it; a second → `rejected` 409, and
        nothing is queued. Then `accepted` (the client drops it: its stream has one). A store
        that fails (it may have stored it): `error` 503 and an abort of the new generation.

What admission cannot check: that the id was ever the lease's. Nobody alive remembers the
placement (that is why the client resumes); a resume of an id the lease never had runs
only for that lease, on its own inbox, billed to its tenant — a request with a chosen id. It
does not use up the true lease's resume (another message id), and a worker that ran the id
refuses it as a reused id (`error` 409).
"""

from __future__ import annotations

import time

import msgspec
from nats.aio.msg import Msg
from tokenyard.shared import codec, schemas, subjects, telemetry
from tokenyard.shared.resume import ResumeAsk, resume_msg_id
from tokenyard.shared.subjects import lease_of

log = telemetry.logger("admission")


def resumed(core, ask: ResumeAsk, reply_to: str, headers: dict[str, str] | None,
            now: float) -> schemas.AdmittedRequest | schemas.Rejected:
    rid = ask.request.request_id or ""

    def refuse(message: str) -> schemas.Rejected:
        return schemas.Rejected(rid, 400, "resume_refused", message, param="resume")

    lease = lease_of(reply_to)
    if not rid:
        return refuse("a resume names the request id of the stream it resumes")
    if not lease or lease_of(ask.was_reply_to) != lease or ask.was_reply_to == reply_to:
        return refuse("a stream is resumed on a new inbox of the lease it streamed to")
    if ask.next_seq < 1 or not ask.token_ids:
        return refuse("a stream is resumed after its first chunk (a queued request needs no resume)")
    verdict = core.admit(ask.request, reply_to=reply_to, json=ask.json, headers=headers, now=now, new_id=rid)
    if isinstance(verdict, schemas.Rejected):
        return verdict
    if len(ask.token_ids) >= verdict.max_tokens:
        return refuse(f"{len(ask.token_ids)} tokens came of max_tokens {verdict.max_tokens}: nothing is left")
    return msgspec.structs.replace(verdict, resume_token_ids=list(ask.token_ids), resume_seq=ask.next_seq,
                                   migrations=1)


async def on_resume(shell, msg: Msg) -> None:
    """`llm.v1.resume` (queue group admission): answers on the new inbox, the message's reply."""
    if not subjects.is_inbox(msg.reply):  # nowhere safe to answer (subjects.is_inbox)
        if msg.reply:
            log.warning("resume_reply_not_an_inbox", reply=msg.reply[:200])
            shell.metrics.observe(schemas.Outcome.REJECTED_INVALID, "reply_not_an_inbox")
        return
    json = codec.is_json(msg.headers)

    async def answer(event: schemas.StreamEvent) -> None:
        await shell.nc.publish(msg.reply, codec.encode(event, json=json), headers=codec.content_headers(json))

    try:
        ask = codec.decode(msg.data, ResumeAsk, json=json)
    except codec.DecodeError as e:
        await answer(schemas.Rejected("", 400, "invalid_request_error", f"malformed resume: {e}"))
        return
    json = ask.json
    verdict = resumed(shell.core, ask, msg.reply, msg.headers, time.time())
    if isinstance(verdict, schemas.Rejected):
        log.info("resume_refused", request_id=verdict.request_id, status=verdict.status, reason=verdict.message)
        await answer(verdict)
        return
    rid = verdict.request_id
    try:  # admission's own store: its first attempt, then its retry through a failover
        ack, retried = await shell.store(verdict, codec.encode(verdict), {}, msg_id=resume_msg_id(rid, lease_of(msg.reply)))
    except Exception as e:  # one that timed out may have stored it: an error, and an abort of what may run
        log.warning("resume_store_failed", request_id=rid, error=repr(e))
        await answer(schemas.Error(rid, 503, f"queue unavailable, the resume is aborted: {e!r}", seq=verdict.resume_seq))
        await shell.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(rid, reason="queue_unavailable",
                                                                          reply_to=msg.reply)))
        return
    if ack.duplicate and not retried:  # a retry's duplicate is its own first attempt
        log.info("resume_duplicate", request_id=rid)
        await answer(schemas.Rejected(rid, 409, "resume_refused", f"request '{rid}' was resumed already", param="resume"))
        return
    log.info("resumed", request_id=rid, tokens=len(verdict.resume_token_ids), seq=verdict.resume_seq)
    shell.metrics.observe(schemas.Outcome.ADMITTED)
    await answer(schemas.Accepted(request_id=rid, priority=verdict.priority, prompt_tokens=verdict.prompt_len))
