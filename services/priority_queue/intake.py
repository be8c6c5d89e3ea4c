"""What the queue takes in from its JetStream stream: each stored message decoded and checked
before it is queued (`check`). One that does not decode, or whose numbers the router cannot take
(router/bounds.py: a hostile block size), is terminated — JetStream never redelivers it —
and its client, where the request decoded, is told with a 400 `error` instead of waiting
(`refuse`). Admission never stores such a request; any service allowed to publish to the stream
could: put back in line after each 400 route answer, it would be retried for ever."""

from __future__ import annotations

import contextlib

from nats.aio.client import Client
from nats.aio.msg import Msg
from tokenyard.services.router.bounds import check_inputs
from tokenyard.shared import codec, schemas, telemetry

log = telemetry.logger("queue")


def check(data: bytes) -> tuple[schemas.AdmittedRequest | None, str | None]:
    """(the request, None) when it can be queued; else (the request, or None where it did not
    decode, and why not)."""
    try:
        req = codec.decode(data, schemas.AdmittedRequestInTransit)
    except codec.DecodeError as e:
        return None, f"undecodable: {e}"
    try:
        check_inputs(req)
    except ValueError as e:
        return req, str(e)
    return req, None


async def refuse(nc: Client, msg: Msg, req: schemas.AdmittedRequest | None, why: str) -> None:
    """Terminate `msg`; tell `req`'s client why (a 400 that ends its stream)."""
    log.error("unservable_message", request_id=req.request_id if req else None, error=why)
    with contextlib.suppress(Exception):
        await msg.term()
    if req is not None:
        error = schemas.Error(req.request_id, 400, f"bad request: {why}")
        with contextlib.suppress(Exception):
            await nc.publish(req.reply_to, codec.encode(error, json=req.json), headers=codec.content_headers(req.json))
