"""A client resumes its own stream, once, when the stream's worker is proven gone and nobody
else moved it (its placing router died before the worker could hand it over): the hand-over
window of services/worker/leases.py, closed from the one end that always knows the stream.

    client (shared/client.py, shared/stream_watch.py)       admission (services/admission/resume.py)
    ─ the worker proven gone (two "no responders")
    ─ abort the old generation (Abort.reply_to = old inbox):
      every live worker refuses it from now on, a live
      router that follows it drops it
    ─ ResumeAsk on `llm.v1.resume`, reply = a new inbox ─>  ─ the same lease, a new inbox, tokens left
                                                            ─ admitted as any request, then resumed:
                                                              resume_token_ids / resume_seq set
                                                            ─ into JetStream with Nats-Msg-Id
                                                              `<id>.resume.<lease>`: a second resume of
                                                              the id from the lease is a duplicate → 409
    <─ accepted (dropped: the stream has one) / rejected / error
    <─ chunks numbered on from next_seq, from the worker the queue and a router place it on

The new inbox is what makes it safe: whatever still streams to the old one (a live router's
re-issue that raced the abort) reaches no reader, so the user sees one continuation, never
two interleaved.
"""

from __future__ import annotations

import msgspec
from tokenyard.shared import schemas
from tokenyard.shared.schemas import Int64


class ResumeAsk(msgspec.Struct, omit_defaults=True):
    """A client's resume of its stream `request` (its request id set) that streamed to
    `was_reply_to`: the token ids of every chunk it got (seq order) and the seq it expects next."""

    request: schemas.GenerateRequest
    was_reply_to: str
    token_ids: list[Int64]
    next_seq: Int64
    json: bool = False
    """Answer in JSON rather than MessagePack (as the stream did)."""


def resume_msg_id(request_id: str, lease: str) -> str:
    """The JetStream message id of a resume: one per request id and lease in the duplicate window."""
    return f"{request_id}.resume.{lease}"
