"""Admission's shell: a `nats.micro` endpoint on `llm.v1.submit` (queue group `admission`, so
replicas share the load). For each request: decode (MessagePack, or JSON by header), ask the
core, then either answer `rejected` on the reply subject, or answer `accepted` and publish
the AdmittedRequest to JetStream (`llm.v1.queue`, `Nats-Msg-Id` = request id, so a retried
publish is dropped as a duplicate).

`accepted` goes out once JetStream stored the request: its ack says whether the id was a
duplicate (a reused request id, within the stream's duplicate window), which is answered
with `rejected` 409 instead of silence (the first request keeps running). If the publish
fails, the client gets `rejected` 503. A worker's first chunk can in principle overtake
`accepted` (it is caused by the same publish); TokenyardClient holds such events back.

For SLO feasibility the core is fed the workers' heartbeats (`llm.v1.hb.*`) and the queue's
state (`llm.v1.pq.state`); a refusal (429 / 503) is answered at once, before any tokenizing.
A tick every TICK_S / 2 tells the core it is awake: a longer gap between its events is its own
stall, which does not make the workers look silent (liveness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError
from nats.micro.request import Request
from nats.micro.service import Service
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared import codec, config, natsutil, schemas, subjects, telemetry
from tokenyard.shared.metrics import AdmissionMetrics
from tokenyard.shared.service import new_instance_id
from tokenyard.shared.tokenizer import Tokenizer

log = telemetry.logger("admission")

TICK_S = config.HEARTBEAT_INTERVAL_S
"""The most admission leaves between two of its own events: it ticks twice as often."""


class AdmissionShell:
    kind = "admission"

    def __init__(self, cfg: AdmissionConfig, tokenizer: Tokenizer):
        self.core = AdmissionCore(cfg, tokenizer)
        self.instance_id = new_instance_id(self.kind)
        self.nc: Client | None = None
        self.metrics = AdmissionMetrics()
        self._inflight: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        await natsutil.ensure_queue_stream(nc)
        self.core.ticks_every(TICK_S)
        self._ticker = asyncio.create_task(self._tick())
        await nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        await nc.subscribe(subjects.QUEUE_STATE, cb=self._on_queue_state)
        await service.add_endpoint(
            name="submit", subject=subjects.SUBMIT, queue_group=subjects.GROUP_ADMISSION, handler=self._on_submit
        )

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S / 2)
            if self.nc is not None and self.nc.is_connected:  # cut off from NATS it hears nothing:
                self.core.on_tick(time.time())  # that time is its own blind time, not the workers' silence

    async def _on_heartbeat(self, msg) -> None:
        try:
            self.core.on_heartbeat(codec.decode(msg.data, schemas.Heartbeat), time.time())
        except codec.DecodeError:
            pass

    async def _on_queue_state(self, msg) -> None:
        try:
            self.core.on_queue_stats(codec.decode(msg.data, schemas.QueueStats), time.time())
        except codec.DecodeError:
            pass

    async def _on_submit(self, req: Request) -> None:
        """The decision in the endpoint's own pass, in arrival order (the micro endpoint awaits
        its handler message by message; nothing before the decision suspends): a refusal is
        answered at once (a publish into the client's buffer), ahead of every admitted request's
        JetStream publish and `accepted`, which run in a task each — one slow JetStream round trip
        holds up no request behind it, and in an overload, where most requests are refused, a
        refusal waits for no admitted request's publish work. The decisions stay in order, so each
        one counts every admission before it (feasibility.FleetView.on_admitted)."""
        headers = req.headers or {}
        json = codec.is_json(headers) or req.data[:1] == b"{"
        reply_to = req._msg.reply  # the request's stream: every later hop publishes here
        # The span of an admitted request ends with its JetStream publish (`_publish`): its
        # outcome is known only then (stored, a reused id, or not stored at all).
        with telemetry.span(self.kind, "process", subjects.SUBMIT, headers, end_on_exit=False) as span, \
                contextlib.ExitStack() as ends:
            ends.callback(span.end)
            try:
                body = codec.decode(req.data, schemas.GenerateRequest, json=json)
            except codec.DecodeError as e:
                verdict: schemas.AdmittedRequest | schemas.Rejected = schemas.Rejected(
                    request_id="", status=400, code="invalid_request_error", message=f"malformed request: {e}"
                )
            else:
                now = time.time()
                self.core.on_tick(now)  # after a stall of this process, the first thing it notes
                verdict = self.core.admit(  # an id is drawn only for a request that brings none
                    body, reply_to=reply_to or "", json=json, headers=headers, now=now,
                    new_id=body.request_id or uuid.uuid4().hex,
                )
            span.set_attribute("messaging.message.id", verdict.request_id)
            if isinstance(verdict, schemas.AdmittedRequest):
                queued = codec.encode(verdict)
                if len(queued) > self.nc.max_payload:  # the prompt's tokens would not fit the queue's message
                    verdict = schemas.Rejected(
                        request_id=verdict.request_id, status=413, code="request_too_large", param="prompt",
                        message=f"the admitted request is {len(queued)} bytes, more than the bus carries "
                                f"({self.nc.max_payload})")
            if isinstance(verdict, schemas.Rejected):
                # The answer first: in an overload most requests end here, and the client (and
                # every request behind this one) should not wait for its log line and metric.
                if reply_to:
                    await req.respond(codec.encode(verdict, json=json), headers=codec.content_headers(json))
                outcome = {429: schemas.Outcome.REJECTED_RATE, 503: schemas.Outcome.REJECTED_CAPACITY}.get(
                    verdict.status, schemas.Outcome.REJECTED_INVALID)
                span.set_attribute("tokenyard.outcome", outcome)
                self.metrics.observe(outcome, verdict.code)
                log.info("rejected", request_id=verdict.request_id, status=verdict.status, reason=verdict.message)
                return
            if telemetry.recording():  # where admission's own work ends and JetStream's begins
                span.set_attribute("tokenyard.enqueue_ns", time.time_ns())
            trace = telemetry.inject()  # the queue's span is a child of this one
            task = asyncio.create_task(self._publish(req, verdict, queued, json, trace, span))
            ends.pop_all()  # the task ends the span
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _enqueue(self, verdict: schemas.AdmittedRequest, data: bytes, headers: dict[str, str]):
        """(the PubAck, whether it took a retry). `data`: `verdict` encoded. One plain attempt
        first, so that its ack's `duplicate` tells a reused request id; then retried through a
        cluster node's failover (natsutil.publish_durably), where a duplicate may be an earlier
        attempt that landed."""
        try:
            return await self.js.publish(subjects.QUEUE, data, headers={**headers, "Nats-Msg-Id": verdict.request_id},
                                         timeout=2.0), False
        except (NatsTimeout, NoRespondersError, NoStreamResponseError, TimeoutError):
            ack = await natsutil.publish_durably(self.js, subjects.QUEUE, data, verdict.request_id, headers=headers)
            return ack, True

    async def _publish(self, req: Request, verdict: schemas.AdmittedRequest, queued: bytes, json: bool,
                       trace: dict[str, str], span) -> None:
        """An admitted request: into JetStream, then `accepted` (or 409 / 503, nothing queued).
        Its span (`_on_submit`'s) records what JetStream made of it, and ends here."""
        rid = verdict.request_id
        outcome = schemas.Outcome.ADMIT_FAILED  # until JetStream has stored it
        try:
            try:
                ack, retried = await self._enqueue(verdict, queued, trace)
            except Exception as e:  # JetStream unavailable or full: say so, nothing was queued
                log.warning("enqueue_failed", request_id=rid, error=repr(e))
                refusal = schemas.Rejected(rid, 503, "queue_unavailable", f"queue unavailable: {e!r}")
                await req.respond(codec.encode(refusal, json=json), headers=codec.content_headers(json))
                self.metrics.observe(schemas.Outcome.FAILED, "queue_unavailable")
                return
            if ack.duplicate and not retried:  # a retry's duplicate is its own first attempt
                outcome = schemas.Outcome.DUPLICATE
                log.info("duplicate_request_id", request_id=rid)
                refusal = schemas.Rejected(
                    rid, 409, "duplicate_request_id", f"request id '{rid}' is already in use", param="request_id"
                )
                await req.respond(codec.encode(refusal, json=json), headers=codec.content_headers(json))
                return
            outcome = schemas.Outcome.ADMITTED
            accepted = schemas.Accepted(request_id=rid, priority=verdict.priority, prompt_tokens=verdict.prompt_len)
            await req.respond(codec.encode(accepted, json=json), headers=codec.content_headers(json))
            self.metrics.observe(schemas.Outcome.ADMITTED)
        finally:
            span.set_attribute("tokenyard.outcome", outcome)
            span.end()
