"""Admission's shell: a `nats.micro` endpoint on `llm.v1.submit` (queue group `admission`, so
replicas share the load). For each request: decode (MessagePack, or JSON by header), ask the
core, then either answer `rejected` on the reply subject, or answer `accepted` and publish
the AdmittedRequest to JetStream (`llm.v1.queue`, `Nats-Msg-Id` = request id, so a retried
publish is dropped as a duplicate).

`accepted` goes out once JetStream stored the request: its ack says whether the id was a
duplicate (a reused request id, within the stream's duplicate window), which is answered
with `rejected` 409 instead of silence (the first request keeps running). If the publish
fails, the client gets `rejected` 503; if its first attempt timed out (the ack may be what was
lost: the request may be stored, and run) and the retries failed, an `error` 503 and an abort
instead (`MaybeStored`): never `rejected` after a chunk that carried the acceptance. A worker's first chunk can in principle overtake
`accepted` (it is caused by the same publish); a stream's first chunk carries the acceptance
itself (`Chunk.accepted`), so TokenyardClient takes it as such and drops the later `accepted`.

With a queue in the same process (`tokenyard queue --with-admission`, the default of
`tokenyard up`), an admitted request is handed to it by a call (`LocalQueue.take`): its offer
to a worker leaves first, then its JetStream publish and, right behind it on the same
connection, `accepted` (`_hand_over`); the store's ack gives the queue the copy's sequence
(`stored`), and the queue deletes (or acks) the stored copy once it is routed. A
store that then fails, or finds the id a duplicate, ends the stream with an error (503 / 409)
after `accepted`, and the queue gives the request back (`withdraw`); one already on a worker
is aborted there. A reused id this process's queue has seen (JetStream's window) is not handed
over: it takes the path above, and its duplicate is `rejected` 409 as ever.

A stop cut off from NATS (shared/service.py BUS_GONE_S) ends each hand-over whose store has no
ack with a 503 `not queued` to its client instead of dropping it unsaid (`cut_off`).

An edge in the same process (`tokenyard queue --with-admission --http-port P`, `tokenyard up`'s
default) hands its requests over by a call (`submit`) instead of on `llm.v1.submit`; they are
decided the same way, and admission's own answers go straight into the stream's inbox.

For SLO feasibility the core is fed the workers' heartbeats (`llm.v1.hb.*`) and the queue's
state (`llm.v1.pq.state`); a refusal (429 / 503) is answered at once, before any tokenizing.
A tick every TICK_S / 2 tells the core it is awake: a longer gap between its events is its own
stall, which does not make the workers look silent (liveness.py). The connection its heartbeats
come in on, back from an outage, is told to the core before anything else it handles
(`_note_return`: nats-py counts a reconnect before it subscribes again): the workers up when it
lost the bus are excused natsutil.RECONNECT_BOUND_S of silence, the longest theirs take.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
import weakref
from typing import Protocol

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError
from nats.micro.request import Request
from nats.micro.service import Service
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.resume import on_resume
from tokenyard.shared import codec, config, natsutil, schemas, subjects, telemetry
from tokenyard.shared.feed import ProcessFeeds
from tokenyard.shared.metrics import AdmissionMetrics
from tokenyard.shared.natsutil import MaybeStored
from tokenyard.shared.service import new_instance_id
from tokenyard.shared.tokenizer import Tokenizer

log = telemetry.logger("admission")

PLACING_WAIT_S = 0.05
"""The most a handed request's store waits for its route's answer (the worker's, which leaves
with the first token: under a millisecond on an idle fleet, REPLY_HOLD_S for a real prefill;
this is only a bound). Until the store's publish leaves, the request is in this process and on
the worker it was offered to, not yet in JetStream."""
STORE_AFTER_S = 0.003
"""How long a handed request's store waits after its route's answer: the worker's first event came
with that answer, and its way on to the client — through nats-server, or through the edge in
this process (`submit`) — goes first, not beside the store, its ack and its copy's delivery on
the same CPUs. Measured side by side (docs/results-latency.md round 11): 1 ms against none
−0.2 ms TTFT added over HTTP, −0.1 over NATS; 3 ms against 1 ms another −0.13 to −0.2 over HTTP.
The window in which a crash of this process loses a placed request's stored copy (the worker
runs it on; its chunks carry the acceptance) grows by as much. Only a routed request waits: one
that waits for room (`take`'s future says False) is stored at once — in this process alone, a
crash would lose it with no event at its client (a NATS client's 60 s watchdog the only end)."""
CUT_OFF = "cut_off"
"""The cancel message of a hand-over its host ends for a stop without NATS (`cut_off`)."""
TICK_S = config.HEARTBEAT_INTERVAL_S
"""The most admission leaves between two of its own events: it ticks twice as often."""


class Respond(Protocol):
    """Where admission sends its own answers to a request: the micro request's `respond` (a
    publish on its reply subject), or the in-process edge's inbox (`AdmissionShell.submit`)."""

    async def __call__(self, data: bytes, headers: dict[str, str] | None = None) -> None: ...


class LocalQueue(Protocol):
    """A queue in this process (services/priority_queue/shell.py QueueShell)."""

    instance_id: str

    def take(self, req: schemas.AdmittedRequest, data: bytes, headers: dict[str, str]) -> asyncio.Future | None: ...

    def withdraw(self, request_id: str) -> bool: ...

    def stored(self, request_id: str, seq: int) -> None: ...


class AdmissionShell:
    kind = "admission"

    def __init__(self, cfg: AdmissionConfig, tokenizer: Tokenizer, queue: LocalQueue | None = None,
                 feeds: ProcessFeeds | None = None):
        """`queue`: a queue in this process, handed each admitted request at once (None: the
        queue hears of it from JetStream). `feeds`: the heartbeat and queue-state
        subscriptions of this process, shared with the services beside it (shared/feed.py);
        None: its own."""
        self.core = AdmissionCore(cfg, tokenizer)
        self.feeds = feeds or ProcessFeeds()
        self.queue = queue
        self._handing: dict[str, asyncio.Task] = {}
        """request id → its hand-over (`_hand_over`) while it runs."""
        self.instance_id = new_instance_id(self.kind)
        self.nc: Client | None = None
        self.metrics = AdmissionMetrics()
        self._inflight: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None
        self._reconnects: weakref.WeakKeyDictionary[Client, int] = weakref.WeakKeyDictionary()
        """Each connection its heartbeats came in on → its reconnects counted when last looked at."""

    @property
    def handing_over(self) -> list[str]:
        """The ids of the requests handed to the queue in this process whose store has not ended."""
        return list(self._handing)

    def kept(self) -> dict[str, int]:
        """Per-request state here, counted (shared/service.py): 0 once its requests are handed on."""
        return {"handing": len(self._handing), "inflight": len(self._inflight)}

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        """Tenants' buckets still refilling (the others are forgotten: AdmissionCore.on_tick)."""
        return {"tenant_buckets": (len(self.core.buckets), None)}

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        await natsutil.ensure_queue_stream(nc)
        self.core.ticks_every(TICK_S)
        self._ticker = asyncio.create_task(self._tick())
        await self.feeds.heartbeats.join(nc, self._on_heartbeat)
        await self.feeds.queue_states.join(nc, self._on_queue_stats)
        await service.add_endpoint(
            name="submit", subject=subjects.SUBMIT, queue_group=subjects.GROUP_ADMISSION, handler=self._on_submit
        )
        await nc.subscribe(subjects.RESUME, queue=subjects.GROUP_ADMISSION, cb=functools.partial(on_resume, self))
        # a plain subscription, as resume's: a micro endpoint would show in `tokenyard top` and repeat
        # the service's stats in $SRV.STATS once more (each endpoint carries them)
        await nc.subscribe(subjects.ADMISSION_HEALTH, queue=subjects.GROUP_ADMISSION, cb=self._on_health)

    def fleet_health(self) -> schemas.FleetHealth:
        """What it sees of the workers now (an HTTP front's readiness: shared/readiness.py);
        asked by a call from an edge in this process, over NATS by one of its own. A tick first, as
        a request's decision has: a stall of this process just before the probe is its own blind
        time, not the workers' silence (else `no_workers` once, until the queued heartbeats are read)."""
        now, observing = time.time(), self._observing()
        self._awake(now)
        return self.core.fleet_health(now, observing)

    async def _on_health(self, msg) -> None:
        if msg.reply:
            await msg.respond(codec.encode(self.fleet_health(), json=codec.is_json(msg.headers)))

    async def cut_off(self) -> None:
        """The host stops cut off from NATS (shared/service.py BUS_GONE_S): a request handed over
        whose store has no ack holds an `accepted` its client may have had by a call (the edge in
        this process), while its store sits in a connection about to close. Each is ended now
        with an error its client can send again on (503 `not_queued`); its copy dies with the
        connection, unsent, and the queue here gives it back: nothing runs for a client told so.
        (A client over NATS hears nothing: its `accepted` sat behind the store, and it resubmits.)"""
        for task in list(self._handing.values()):
            task.cancel(CUT_OFF)
        if self._handing:
            await asyncio.wait(list(self._handing.values()))

    async def stop(self) -> None:
        await self.feeds.heartbeats.leave(self._on_heartbeat)
        await self.feeds.queue_states.leave(self._on_queue_stats)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S / 2)
            self._awake(time.time())

    def _awake(self, now: float) -> None:
        """The core's tick at `now`, a return from an outage first told (`_note_return`)."""
        self._note_return(now)
        self.core.on_tick(now, self._observing())

    def _on_heartbeat(self, hb: schemas.Heartbeat, now: float) -> None:
        self._note_return(now)
        self.core.on_heartbeat(hb, now)

    def _on_queue_stats(self, stats: schemas.QueueStats, now: float) -> None:
        self._note_return(now)
        self.core.on_queue_stats(stats, now)

    def _note_return(self, now: float) -> None:
        """The connection its heartbeats come in on (its own, or another service's in this
        process: shared/feed.py) counted a reconnect since last looked at: the core hears of it
        (at natsutil.reconnected_at, or `now` until nats-py's callback has run), after a tick at
        `now` that counts the outage's blind time, before the message in hand. Its own connection
        alone coming back is no reason: the heartbeats were heard meanwhile, and a worker silent
        then is silent."""
        nc = self.feeds.heartbeats.nc
        if nc is None:
            return
        count = nc.stats["reconnects"]
        if self._reconnects.setdefault(nc, count) != count:
            self._reconnects[nc] = count
            self.core.on_tick(now, self._observing())
            self.core.on_reconnected(min(natsutil.reconnected_at(nc) or now, now), natsutil.RECONNECT_BOUND_S)

    def _observing(self) -> bool:
        """Cut off from NATS it hears nothing — on its own connection, or on the one its
        heartbeats and queue states come in on (the router's, in the queue's process): that time
        is its own blind time, not the workers' silence."""
        return self.nc is not None and self.nc.is_connected and self.feeds.heartbeats.connected \
            and self.feeds.queue_states.connected

    async def _on_submit(self, req: Request) -> None:
        """The decision in the endpoint's own pass, in arrival order (the micro endpoint awaits
        its handler message by message; nothing before the decision suspends): a refusal is
        answered at once (a publish into the client's buffer), ahead of every admitted request's
        JetStream publish and `accepted`, which run in a task each — one slow JetStream round trip
        holds up no request behind it, and in an overload, where most requests are refused, a
        refusal waits for no admitted request's publish work. The decisions stay in order, so each
        one counts every admission before it (feasibility.FleetView.on_admitted)."""
        reply = req._msg.reply
        if reply and not subjects.is_inbox(reply):  # nowhere safe to answer, no one to stream to: not run
            self.metrics.observe(schemas.Outcome.REJECTED_INVALID, "reply_not_an_inbox")
            log.warning("reply_not_an_inbox", reply=reply[:200])
            return
        headers = req.headers or {}
        json = codec.is_json(headers) or req.data[:1] == b"{"
        try:
            body: schemas.GenerateRequest | codec.DecodeError = codec.decode(req.data, schemas.GenerateRequest, json=json)
        except codec.DecodeError as e:
            body = e
        respond = req.respond
        if subjects.RESUBMIT_HEADER in headers:  # its answers say so: its client tells them from the first's
            async def respond(data: bytes, headers: dict[str, str] | None = None) -> None:
                await req.respond(data, headers={**(headers or {}), subjects.RESUBMIT_HEADER: "1"})
        # the request's stream: every later hop publishes there
        await self._decide(body, reply, json, headers, respond)

    async def submit(self, body: schemas.GenerateRequest, reply_to: str, headers: dict[str, str],
                     respond: Respond) -> None:
        """A request from an edge in this process (`tokenyard queue --http-port`), handed over by
        a call instead of a publish on `llm.v1.submit`: decided as `_on_submit` decides one, in
        the order of the calls; admission's own answers (`rejected`, `accepted`, a late `error`)
        go to `respond` (the edge's client puts them in the stream's inbox: no NATS crossing,
        and no reply subject admission could not publish on), the rest of the stream to
        `reply_to` over NATS as ever."""
        await self._decide(body, reply_to, False, headers, respond)

    async def _decide(self, body: schemas.GenerateRequest | codec.DecodeError, reply_to: str | None, json: bool,
                      headers: dict[str, str], respond: Respond) -> None:
        # The span of an admitted request ends with its JetStream publish (`_publish`): its
        # outcome is known only then (stored, a reused id, or not stored at all).
        with telemetry.span(self.kind, "process", subjects.SUBMIT, headers, end_on_exit=False) as span, \
                contextlib.ExitStack() as ends:
            ends.callback(span.end)
            if isinstance(body, codec.DecodeError):
                verdict: schemas.AdmittedRequest | schemas.Rejected = schemas.Rejected(
                    request_id="", status=400, code="invalid_request_error", message=f"malformed request: {body}"
                )
            else:
                now = time.time()
                self._awake(now)  # after a stall of this process, the first thing it notes
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
                    await respond(codec.encode(verdict, json=json), headers=codec.content_headers(json))
                outcome = {429: schemas.Outcome.REJECTED_RATE, 503: schemas.Outcome.REJECTED_CAPACITY}.get(
                    verdict.status, schemas.Outcome.REJECTED_INVALID)
                span.set_attribute("tokenyard.outcome", outcome)
                self.metrics.observe(outcome, verdict.reason or verdict.code)
                log.info("rejected", request_id=verdict.request_id, status=verdict.status, reason=verdict.message)
                return
            if telemetry.recording():  # where admission's own work ends and JetStream's begins
                span.set_attribute("tokenyard.enqueue_ns", time.time_ns())
            trace = telemetry.inject()  # the queue's span is a child of this one
            # a resubmit (subjects.RESUBMIT_HEADER) is stored first: a first that landed makes it a
            # 409 with nothing sent before it, not a generation beside the first's on one inbox
            resubmit = headers.get(subjects.RESUBMIT_HEADER) is not None
            placing = self.queue.take(verdict, queued, trace) if self.queue is not None and not resubmit else None
            if placing is None:  # stored after a hand-over of the same id still storing: JetStream judges them in order
                task = asyncio.create_task(self._publish(respond, verdict, queued, json, trace, span,
                                                         after=self._handing.get(verdict.request_id)))
            else:  # the queue in this process has it: other replicas leave its stored copy to that queue
                stored = {**trace, subjects.TAKEN_BY_HEADER: self.queue.instance_id}
                task = self._handing[verdict.request_id] = asyncio.create_task(
                    self._hand_over(respond, reply_to or "", verdict, queued, json, stored, span, placing))
                task.add_done_callback(lambda t, rid=verdict.request_id: self._handing.pop(rid, None)
                                       if self._handing.get(rid) is t else None)
            ends.pop_all()  # the task ends the span
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def store(self, verdict: schemas.AdmittedRequest, data: bytes, headers: dict[str, str],
                    msg_id: str | None = None):
        """The JetStream store of one admitted request (public: the seam tests replace with a
        failing store): (the PubAck, whether it took a retry). `data`: `verdict` encoded; `msg_id`:
        its JetStream message id (the request id unless given: a resume's is its own). One plain attempt
        first, so that its ack's `duplicate` tells a reused request id; then retried through a
        cluster node's failover (natsutil.publish_durably), where a duplicate may be an earlier
        attempt that landed."""
        msg_id = msg_id or verdict.request_id
        try:
            return await self.js.publish(subjects.QUEUE, data, headers={**headers, "Nats-Msg-Id": msg_id},
                                         timeout=natsutil.ENQUEUE_ATTEMPT_S), False
        except (NatsTimeout, NoRespondersError, NoStreamResponseError, TimeoutError) as first:
            try:  # MaybeStored when a retry timed out
                ack = await natsutil.publish_durably(self.js, subjects.QUEUE, data, msg_id, headers=headers)
            except Exception as e:
                if isinstance(first, NatsTimeout | TimeoutError) and not isinstance(e, MaybeStored):
                    raise MaybeStored(repr(e)) from e  # the first attempt's ack may be what was lost
                raise
            return ack, True

    async def _publish(self, respond: Respond, verdict: schemas.AdmittedRequest, queued: bytes, json: bool,
                       trace: dict[str, str], span, after: asyncio.Task | None = None) -> None:
        """An admitted request: into JetStream, then `accepted` (or 409 / 503, nothing queued).
        Its span (`_on_submit`'s) records what JetStream made of it, and ends here. `after`: the
        hand-over of a request of the same id, whose store goes first."""
        rid = verdict.request_id
        outcome = schemas.Outcome.ADMIT_FAILED  # until JetStream has stored it
        try:
            if after is not None:
                await asyncio.wait([after])
            try:
                ack, retried = await self.store(verdict, queued, trace)
            except MaybeStored as e:  # it may run (its first chunk then says `accepted`): no `rejected`
                # after that; an error ends the stream, whatever came first, and an abort stops
                # the copy wherever it went (a queue's, or a worker's)
                log.warning("enqueue_unknown", request_id=rid, error=str(e))
                error = schemas.Error(rid, 503, f"queue unavailable (the request may have been queued, and is "
                                                f"aborted): {e}", seq=0)
                await respond(codec.encode(error, json=json), headers=codec.content_headers(json))
                await self.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(rid, reason="queue_unavailable")))
                self.metrics.observe(schemas.Outcome.FAILED, "queue_unavailable")
                return
            except Exception as e:  # JetStream unavailable or full: say so, nothing was queued
                log.warning("enqueue_failed", request_id=rid, error=repr(e))
                refusal = schemas.Rejected(rid, 503, "queue_unavailable", f"queue unavailable: {e!r}")
                await respond(codec.encode(refusal, json=json), headers=codec.content_headers(json))
                self.metrics.observe(schemas.Outcome.FAILED, "queue_unavailable")
                return
            if ack.duplicate and not retried:  # a retry's duplicate is its own first attempt
                outcome = schemas.Outcome.DUPLICATE
                log.info("duplicate_request_id", request_id=rid)
                refusal = schemas.Rejected(
                    rid, 409, "duplicate_request_id", f"request id '{rid}' is already in use", param="request_id"
                )
                await respond(codec.encode(refusal, json=json), headers=codec.content_headers(json))
                return
            outcome = schemas.Outcome.ADMITTED
            accepted = schemas.Accepted(request_id=rid, priority=verdict.priority, prompt_tokens=verdict.prompt_len)
            await respond(codec.encode(accepted, json=json), headers=codec.content_headers(json))
            self.metrics.observe(schemas.Outcome.ADMITTED)
        finally:
            span.set_attribute("tokenyard.outcome", outcome)
            span.end()

    async def _hand_over(self, respond: Respond, reply_to: str, verdict: schemas.AdmittedRequest, queued: bytes, json: bool,
                         trace: dict[str, str], span, placing: asyncio.Future) -> None:
        """A request the queue in this process took (`placing`: done once its route has an answer
        — the worker's, which leaves with the first token — or it waits for room): then into
        JetStream, and `accepted` right behind the store's publish, on the same connection,
        without waiting for the ack — so the store, its ack, its copy's delivery and `accepted`
        run after the first token's path, not beside it on the same CPUs, and the server has the
        store's publish before the client has
        `accepted` (a crash of this process after the server has stored it loses nothing; one
        while the store is still retrying — no stream leader during a cluster's failover — loses
        the request, and its client, which holds `accepted`, is ended by its idle timeout, 504
        after 60 s without an event). If the store then fails,
        or finds the id a duplicate (an id this queue never saw, reused: another replica's),
        the stream ends with an error (503 / 409) and the queue takes the request back; one
        already on a worker when the store failed is aborted there. Its span ends here, as
        `_publish`'s does."""
        rid = verdict.request_id
        outcome = schemas.Outcome.ADMIT_FAILED  # until JetStream has stored it
        store: asyncio.Future | None = None
        try:
            routed = False
            with contextlib.suppress(TimeoutError):  # a bound only: the worker answers within a millisecond or two
                async with asyncio.timeout(PLACING_WAIT_S):
                    routed = await placing
            if routed:  # the first token, which came with the answer, goes out first; one that waits
                await asyncio.sleep(STORE_AFTER_S)  # for room has no token to let by: a crash here would lose it
                trace = {**trace, subjects.PLACED_HEADER: "1"}  # no replica places its copy again
            store = asyncio.ensure_future(self.store(verdict, queued, trace))
            await asyncio.sleep(0)  # the store's first step ran: its publish is in the connection's buffer
            accepted = schemas.Accepted(request_id=rid, priority=verdict.priority, prompt_tokens=verdict.prompt_len)
            await respond(codec.encode(accepted, json=json), headers=codec.content_headers(json))
            try:
                ack, retried = await store
            except Exception as e:  # JetStream unavailable or full
                log.warning("enqueue_failed", request_id=rid, error=repr(e))
                error = schemas.Error(rid, 503, f"queue unavailable: {e!r}", seq=0)
                await respond(codec.encode(error, json=json), headers=codec.content_headers(json))
                if not self.queue.withdraw(rid):  # on its way to a worker: stop it there (after the error: its end)
                    await self.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(rid, reason="queue_unavailable")))
                self.metrics.observe(schemas.Outcome.FAILED, "queue_unavailable")
                return
            if ack.duplicate and not retried:
                outcome = schemas.Outcome.DUPLICATE
                log.info("duplicate_request_id", request_id=rid)
                left = not self.queue.withdraw(rid)
                error = schemas.Error(rid, 409, f"request id '{rid}' is already in use", seq=0)
                await respond(codec.encode(error, json=json), headers=codec.content_headers(json))
                if left:  # placed already (the first request of the id is another replica's, its queue
                    # never saw the id): stop this generation alone — the first request runs on
                    await self.nc.publish(subjects.ABORT, codec.encode(
                        schemas.Abort(rid, reason="duplicate_request_id", reply_to=reply_to)))
                return
            outcome = schemas.Outcome.ADMITTED
            self.queue.stored(rid, ack.seq)  # its copy is deleted once it is routed: no other replica places it again
            self.metrics.observe(schemas.Outcome.ADMITTED)
        except asyncio.CancelledError as e:
            if CUT_OFF not in e.args:
                raise
            await self._not_queued(respond, rid, json, store)
        finally:
            span.set_attribute("tokenyard.outcome", outcome)
            span.end()

    async def _not_queued(self, respond: Respond, rid: str, json: bool, store: asyncio.Future | None) -> None:
        """A hand-over ended by `cut_off`: its store is dropped, its client told (before or after
        `accepted`, an error: `accepted` may have gone), the queue here gives the request back."""
        if store is not None:
            store.cancel()
        log.warning("not_queued", request_id=rid, why="stopped cut off from NATS")
        error = schemas.Error(rid, 503, "not queued: admission stopped cut off from NATS before the queue "
                                        "confirmed the request; send it again", seq=0)
        with contextlib.suppress(Exception):
            await respond(codec.encode(error, json=json), headers=codec.content_headers(json))
        self.queue.withdraw(rid)
        self.metrics.observe(schemas.Outcome.FAILED, "not_queued")
