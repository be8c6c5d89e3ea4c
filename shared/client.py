"""A small Python client for tokenyard over NATS.

    async with await TokenyardClient.connect("nats://127.0.0.1:4222") as client:
        async for event in client.stream(GenerateRequest(model="tokenyard-sim", prompt="Hi", max_tokens=8)):
            ...                                  # Accepted, Chunk…, then Finished (or Rejected / Error)
        result = await client.generate(GenerateRequest(prompt="Hi", max_tokens=8))
        await client.abort(request_id)

The protocol underneath, for clients in other languages: subscribe to an inbox, publish the
request on `llm.v1.submit` with that inbox as reply subject (MessagePack, or JSON with
header `Content-Type: application/json`), then read events tagged by `type` until one of
`rejected`, `finished`, `error`. Chunks carry `seq` 0, 1, 2 …; drop a seq seen before (a
migrated request may repeat one); a seq skipped, or a `finished` whose seq is not the next
one, means tokens were lost: treat the stream as failed. Optionally hold a lease: publish
`llm.v1.lease.<lease>` every second, use inboxes `_INBOX.<lease>.<n>` and stay subscribed to
`_INBOX.<lease>.alive`; if you vanish (that subscription with you), the routers abort your
requests; a lease that is only late (30 s at most) costs nothing.

What this client guarantees on top: every stream ends with exactly one terminal event.
  * A gap in the seqs (or a `finished` that skips some) is repaired when the missing chunks
    arrive within GAP_WAIT_S (a worker replays what it sent during a NATS outage; the
    events after the gap wait in order meanwhile), else the stream ends with an `error` 502
    and the request is aborted: a stream is never silently short.
  * No event for `idle_timeout_s` (the idle watchdog) ends it with an `error` 504 and aborts it.
  * A running stream that goes silent gets its worker (named by its first chunk) probed; once
    two "no responders" prove it gone and no router moved the stream (its placing router died
    first: shared/stream_watch.py), the client resumes it, once, on a new inbox with the tokens
    it got (shared/resume.py): the reader sees one stream, no seq twice, none missing. A resume
    refused, or a resumed stream lost again and moved by no router within the routers'
    re-issue deadline, ends it with an `error` 503, not silence until the idle timeout.
  * A submit that has no answer at all (not even `accepted`) within natsutil.SUBMIT_ANSWER_S
    was lost with the admission process that took it: it is sent once more, same id, same
    inbox, marked (subjects.RESUBMIT_HEADER) so that admission stores it first; a 409
    `duplicate_request_id` then means the first did land (its stored copy runs once a queue
    replica takes it over) and is dropped. One still unanswered when the connection
    reconnects is sent again RECONNECT_RESUBMIT_S after the reconnect: published as the server
    went away, it was lost with the connection.
  * After its NATS connection reconnected, events sent meanwhile may be lost for good (the
    inbox was resubscribed after they went by): a stream that then stays silent for
    RECONNECT_GRACE_S ends with an `error` 503; one whose next chunk skips a seq with a 502.
  * `accepted` always comes first, once. A stream's first chunk carries the acceptance
    (Chunk.accepted: the worker sends it, admission's `accepted` may arrive after it); the
    client yields that acceptance, then the chunk, and drops admission's copy when it comes.
    Other events that overtake `accepted` are held back until it arrives.
  * A reader that leaves a stream before its end — cancelled, or out of its `async for` by a
    `break` (the generator closed) — aborts the request: no worker generates what nobody reads.
  * `close()` aborts every open stream's request and ends the stream with an `error`
    CLIENT_CLOSED (499, the client closed it); a stream asked of a closed client ends so at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from tokenyard.shared import codec, nats_auth, nats_internals, natsutil, schemas, subjects, telemetry
from tokenyard.shared.completion import Completion, gather
from tokenyard.shared.inbox import Inbox
from tokenyard.shared.local_admission import LocalAdmission, LocalAnswer
from tokenyard.shared.resume import ResumeAsk
from tokenyard.shared.stream_check import StreamCheck
from tokenyard.shared.stream_watch import ResumeDue, StreamWatch, WorkerGone, WorkerProbe

log = telemetry.logger("client")

LEASE_INTERVAL_S = 1.0
"""How often a client says it is alive (a router probes a lease silent for 3 of these)."""

RECONNECT_GRACE_S = 8.0
"""After a reconnect, the silence that says the stream's end was lost in the outage."""

RECONNECT_RESUBMIT_S = 2.0
"""A submit with no answer at all when this connection reconnected is sent again (marked) this
long after the reconnect, not SUBMIT_ANSWER_S after it left: one published as the server went
away was lost with the connection (no admission ever saw it), and its stream would otherwise end
with RECONNECT_GRACE_S's 503. As long as the no-responders window, so a first that nats-py
buffered and sent on the reconnect has been answered, or refused by "no responders", by then."""

CLIENT_CLOSED = 499
"""The status of the `error` that ends a stream its own client closed (nginx's "client closed
request"): not the fleet's doing, so no 5xx."""

WORKER_PROBE_TIMEOUT_S = 1.0
"""A probe of a silent stream's worker unanswered this long: alive or late (not gone)."""

MUX_FLUSH_TIMEOUT_S = 2.0  # the most the first stream waits for its inbox subscription's confirmation
IDLE_TIMEOUT_S = 60.0
"""Default silence after which a stream ends with an error: above the queue's longest
ordinary wait for a P2 request (its 60 s TTFT target), far above worker-death detection."""


async def _ignore(_msg) -> None:
    """The lease's `alive` subscription answers nothing: being subscribed is the answer."""


class TokenyardClient:
    def __init__(self, nc: Client, owns_connection: bool = False, lease: bool = True,
                 admission: LocalAdmission | None = None):
        """`admission`: admission in this process, handed each request by a call (the edge in
        the queue's process); None: requests go out on `llm.v1.submit`."""
        self.nc = nc
        self.admission = admission
        self._owns = owns_connection
        self.lease_id = uuid.uuid4().hex[:16] if lease else ""
        self._lease_task: asyncio.Task | None = None
        self._mux_token = self.lease_id or "s" + uuid.uuid4().hex[:15]
        """The inbox level all this client's streams share: the lease (so a router finds it in
        each request's reply subject), or, without a lease, a token that is not one."""
        self._inboxes: dict[str, Inbox] = {}
        """The open streams' inboxes, by subject."""
        self._inbox_base = ""
        """`<prefix>.<token>.`, every stream's inbox but its last token (made on first use)."""
        self._numbers = itertools.count()
        self._mux = None
        self._mux_lock = asyncio.Lock()
        self._taps: dict[str, Callable[[Any], None]] = {}
        """Stream inbox subject → who else reads each message that reaches it (`tap`)."""
        self.closed = False
        self.resumes = 0
        """Streams this client resumed (shared/resume.py)."""

    @classmethod
    async def connect(cls, url: str, name: str = "tokenyard-client",
                      creds: nats_auth.Credentials | None = None) -> TokenyardClient:
        """Connect as a client (nats_auth: `client.creds`, or `TOKENYARD_NATS_CREDS`)."""
        return cls(await natsutil.connect(url, name, kind=nats_auth.CLIENT, creds=creds), owns_connection=True)

    async def close(self) -> None:
        """Abort every open stream's request, end each of those streams with an `error`
        CLIENT_CLOSED, stop the lease and (if this client opened it) drain the connection."""
        self.closed = True
        for box in list(self._inboxes.values()):
            if not box.closed and not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.nc.publish(subjects.ABORT, codec.encode(
                        schemas.Abort(request_id=box.request_id, reason="client_closed")))
            box.end()
        if self._inboxes and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.flush()
        if self._lease_task is not None:
            self._lease_task.cancel()
            self._lease_task = None
        if self._mux is not None:
            with contextlib.suppress(Exception):
                await self._mux.unsubscribe()
            self._mux = None
        if self._owns and not self.nc.is_closed:
            await self.nc.drain()

    def open_streams(self) -> dict[str, int]:
        """request id → events arrived and not yet read, for each stream this client has open."""
        return {box.request_id: len(box.msgs) for box in self._inboxes.values()}

    @property
    def leasing(self) -> bool:
        """Whether this client renews a lease (from its first request until `close`)."""
        return self._lease_task is not None and not self._lease_task.done()

    async def __aenter__(self) -> TokenyardClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _prefix(self) -> str:
        # Under the connection's own inbox prefix (`_INBOX.<user>` when secured).
        return self.nc.new_inbox().rsplit(".", 1)[0]

    async def _open_inbox(self, request_id: str) -> tuple[str, Inbox]:
        """A fresh inbox `<prefix>.<lease>.<n><random>` for one stream, on the client's one
        subscription `<prefix>.<lease>.*` (made on first use): no SUB / UNSUB per request, and
        a burst of events for many streams comes from one task, not one wake-up per stream per
        event. It also covers the lease's `alive` subject (nothing is delivered there)."""
        if self.lease_id and self._lease_task is None:
            self._lease_task = asyncio.create_task(self._renew_lease())
        if self._mux is None:
            async with self._mux_lock:
                if self._mux is None:
                    # Unbounded: `_deliver` hands each message on at once, from nats-py's reader
                    # (nats_internals.deliver_directly); a slow reader's events wait in its own inbox.
                    self._inbox_base = f"{self._prefix()}.{self._mux_token}."
                    mux = await self.nc.subscribe(self._inbox_base + "*", cb=self._deliver_async,
                                                  pending_msgs_limit=0, pending_bytes_limit=0)
                    nats_internals.deliver_directly(mux, self._deliver)
                    # Held by the server before any request names it: another connection of this
                    # process (the router's, beside an in-process edge) may offer it first.
                    with contextlib.suppress(Exception):  # cut off: the request meets that as before
                        await self.nc.flush(timeout=MUX_FLUSH_TIMEOUT_S)
                    self._mux = mux
        # A number and 48 random bits: every service sees (and logs) the lease token before it, so
        # another client could guess a number alone, name it as a reply, and be streamed into.
        subject = f"{self._inbox_base}{next(self._numbers)}{os.urandom(6).hex()}"
        box = self._inboxes[subject] = Inbox(request_id)
        return subject, box

    async def _deliver_async(self, msg) -> None:
        self._deliver(msg)

    def _deliver(self, msg) -> None:
        box = self._inboxes.get(msg.subject)
        if box is not None:  # else a stream already over, or a lease probe: nothing to hand on
            box.put(msg)
        if self._taps and type(msg) is not LocalAnswer and (tap := self._taps.get(msg.subject)) is not None:
            try:
                tap(msg)
            except Exception:  # on nats-py's reader: one tap's failure must not stop the connection's reading
                log.exception("tap_failed", subject=msg.subject)

    def tap(self, subject: str, reader: Callable[[Any], None]) -> bool:
        """Hand every message that comes over NATS to `subject`, one of this client's stream
        inboxes, to `reader` too, as it arrives (on nats-py's reader: `reader` must not block):
        how a router in this process follows the streams of the edge beside it, with no
        subscription of its own (services/router/follow.py). False where `subject` is not this
        client's (the caller subscribes to it instead). Admission's answers handed over in this
        process are not NATS messages, and are not passed on."""
        if self.closed or self._mux is None or not subject.startswith(self._inbox_base):
            return False
        self._taps[subject] = reader
        return True

    def untap(self, subject: str) -> None:
        self._taps.pop(subject, None)

    async def _answer(self, inbox: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Admission in this process answers a stream (`LocalAdmission`): into its inbox."""
        self._deliver(LocalAnswer(inbox, data, headers))

    async def _renew_lease(self) -> None:
        """Publish the lease every LEASE_INTERVAL_S, and hold `<inbox prefix>.<lease>.alive`
        while it runs: a router that stops hearing the lease probes that subject, and only
        "no responders" (this client gone) makes it abort our requests — a client that is
        merely late (its event loop stalled) keeps them. Ends once the connection is closed (by
        its owner, without `close()`): it would otherwise run for the life of the process."""
        subject = subjects.lease(self.lease_id)
        alive = None
        with contextlib.suppress(Exception):
            alive = await self.nc.subscribe(f"{self._prefix()}.{self.lease_id}.alive", cb=_ignore)
        try:
            while not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.nc.publish(subject, b"")
                await asyncio.sleep(LEASE_INTERVAL_S)
        finally:
            if alive is not None:
                with contextlib.suppress(Exception):
                    await alive.unsubscribe()

    async def stream(self, request: schemas.GenerateRequest, **kwargs) -> AsyncIterator[schemas.StreamEvent]:
        """Submit and yield the request's events in order, ending with exactly one terminal one
        (`stream_batches`' arguments)."""
        batches = self.stream_batches(request, **kwargs)
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            await batches.aclose()

    async def stream_batches(
        self,
        request: schemas.GenerateRequest,
        *,
        json: bool = False,
        headers: dict[str, str] | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        no_responders_retry_s: float = 2.0,
        published: bool = False,
        submit_answer_s: float = natsutil.SUBMIT_ANSWER_S,
    ) -> AsyncIterator[list[schemas.StreamEvent]]:
        """Submit and yield the request's events in order, a list at a time: every event that
        had arrived when the reader came back for more (a relay writes each list at once), the
        last list ending with exactly one terminal event. While no admission replica is
        subscribed (none runs, or the only one is reconnecting after its NATS node died) the
        submit is repeated for `no_responders_retry_s`, then answered 503: nothing received it,
        so a repeat cannot run it twice. A submit sent across this connection's own reconnect
        (nats-py sends what it buffered as soon as it is back, before the services have
        resubscribed) gets that window anew from the reconnect's first "no responders": the one
        that ran out while the bus was down tried nothing. `published`: first yield an empty list
        as soon as the request is out (a relay starts it at once, and sets up the rest while it
        travels)."""
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        rid = request.request_id
        if self.closed:
            yield [self._closed_error(rid, -1)]
            return
        inbox, box = await self._open_inbox(rid)
        check = StreamCheck(rid)
        watch = StreamWatch()
        got: list[int] = []  # the token ids handed on, in seq order: what a resume continues from
        resubmitted = False  # sent again, its first unanswered: a 409 duplicate says the first landed
        ended = False  # a terminal event was yielded (the reader may leave at it)
        try:
            hdrs = submit_hdrs = telemetry.inject({**(headers or {}), **codec.content_headers(json)})

            async def send() -> None:  # submit_hdrs: marked once resubmitted, retries included
                await self.nc.publish(subjects.SUBMIT, codec.encode(request, json=json), reply=inbox,
                                      headers=submit_hdrs)

            if self.admission is not None:  # in this process: a call, its answers straight into the inbox
                await self.admission.submit(request, inbox, hdrs, functools.partial(self._answer, inbox))
            else:
                await send()
            if published:  # let nats-py's flusher send it now, before the caller's set-up runs
                await asyncio.sleep(0)
                yield []
            loop = asyncio.get_running_loop()
            give_up = loop.time() + no_responders_retry_s
            reconnects = submitted_at = self.nc.stats["reconnects"]
            # over NATS only: an admission in this process cannot lose the submit and live on
            resubmit_at = loop.time() + submit_answer_s if self.admission is None else None
            while True:
                idle_until = loop.time() + idle_timeout_s
                after_reconnect = False
                # Wake at least every second to notice that the connection reconnected.
                while not box.msgs and not box.closed and (now := loop.time()) < idle_until:
                    await box.wait(loop, min(idle_until, now + 1.0))
                    if box.msgs or box.closed:
                        break
                    if (gap := check.expired(loop.time())) is not None:
                        await self.abort(rid, reason="client_gap")
                        ended = True
                        yield [gap]
                        return
                    if resubmit_at is not None and loop.time() >= resubmit_at:  # nothing at all came
                        resubmit_at, resubmitted = None, True
                        log.warning("resubmitted", request_id=rid)
                        submit_hdrs = {**hdrs, subjects.RESUBMIT_HEADER: "1"}
                        await send()
                    if self.nc.stats["reconnects"] != reconnects:
                        reconnects = self.nc.stats["reconnects"]
                        after_reconnect = True
                        idle_until = min(idle_until, loop.time() + RECONNECT_GRACE_S)
                        if resubmit_at is not None:  # unanswered: it may have gone down with the connection
                            resubmit_at = min(resubmit_at, loop.time() + RECONNECT_RESUBMIT_S)
                        watch.on_reconnected(loop.time())
                        continue
                    lost = await self._watch(watch, loop)
                    if isinstance(lost, ResumeDue):  # nobody moved it: the rest, on a new inbox
                        inbox, box = await self._resume(request, inbox, box, got, check.next_seq, json, hdrs)
                        watch.on_resumed(loop.time())
                        idle_until = loop.time() + idle_timeout_s
                    elif lost is not None:
                        await self.abort(rid, reason="client_worker_gone", reply_to=inbox)
                        ended = True
                        yield [schemas.Error(rid, 503, f"worker {lost.worker_id} is gone and no router moved the "
                                                       f"stream", seq=check.next_seq)]
                        return
                if box.closed:  # close() has aborted the request
                    ended = True
                    yield [self._closed_error(rid, check.next_seq)]
                    return
                if not box.msgs:
                    await self.abort(rid, reason="client_idle_timeout")
                    ended = True
                    if after_reconnect:
                        yield [schemas.Error(rid, 503, "events lost while NATS reconnected", seq=check.next_seq)]
                    else:
                        yield [schemas.Error(rid, 504, f"no event for {idle_timeout_s:g} s", seq=check.next_seq)]
                    return
                out: list[schemas.StreamEvent] = []
                now = loop.time()
                while box.msgs:
                    msg = box.msgs.popleft()
                    if not msg.data and msg.headers and msg.headers.get("Status") == "503":
                        if watch.resumed:
                            ended = True
                            yield [schemas.Error(rid, 503, "the stream's worker is gone and no admission replica "
                                                           "takes its resume", seq=check.next_seq)]
                            return
                        if self.nc.stats["reconnects"] != submitted_at:  # the bus came back since: its
                            # services resubscribe after us, the window spent in the outage tried nothing
                            submitted_at, give_up = self.nc.stats["reconnects"], loop.time() + no_responders_retry_s
                        if loop.time() < give_up:  # nothing received the request: nothing else is coming
                            await asyncio.sleep(0.1)
                            await send()
                            continue
                        ended = True
                        if resubmitted:  # the first submit may have landed: it must not run for nobody
                            await self.abort(rid, reason="client_resubmit_refused", reply_to=inbox)
                            yield [schemas.Error(rid, 503, "no admission service took the resubmit of a submit "
                                                           "left unanswered", seq=check.next_seq)]
                        else:
                            yield [schemas.Rejected(rid, 503, "no_responders", "no admission service is running")]
                        return
                    try:
                        event = codec.decode_event(msg.data, msg.headers)
                    except codec.DecodeError:
                        continue  # not ours to read: garbage on the inbox changes nothing
                    if event.request_id != rid:
                        continue  # another request's event (a submit that named this inbox as its reply)
                    resubmit_at = None  # answered
                    if type(event) is schemas.Rejected and (
                            (msg.headers or {}).get(subjects.RESUBMIT_HEADER)  # the resubmit's own answer
                            or (resubmitted and event.code == "duplicate_request_id")):  # (an older admission's)
                        if event.code == "duplicate_request_id" or check.accepted or check.ahead:
                            continue  # the first landed, or its stream has begun: it comes here
                        await self.abort(rid, reason="client_resubmit_refused", reply_to=inbox)  # a first that
                        # landed would run for nobody
                    if type(event) is schemas.Chunk:
                        watch.on_chunk(now, event.worker_id)
                    else:
                        watch.on_event(now)
                        if watch.resumed and type(event) is schemas.Rejected:  # the stream has begun: an error
                            event = schemas.Error(rid, 503, f"the stream's worker is gone and its resume was "
                                                            f"refused: {event.message}", seq=check.next_seq)
                    for e in check.on_event(event, now):
                        out.append(e)
                        if type(e) is schemas.Chunk:
                            got.extend(e.token_ids)
                        if isinstance(e, schemas.TERMINAL_EVENTS):
                            ended = True
                            yield out
                            return
                if (gap := check.expired(now)) is not None:  # chunks flow, the hole stays
                    await self.abort(rid, reason="client_gap")
                    out.append(gap)
                    ended = True
                    yield out
                    return
                if out:
                    yield out
        except asyncio.CancelledError:
            await self.abort(rid, reason="client_cancelled")
            raise
        except GeneratorExit:  # the reader left before the end (a `break` out of its `async for`)
            if not ended and not box.closed:  # nobody reads the rest: the worker stops it
                with contextlib.suppress(Exception):  # a closed connection: its lease lapses instead
                    await self.abort(rid, reason="client_left", reply_to=inbox)  # this generation only
            raise
        finally:
            box.close()
            self._inboxes.pop(inbox, None)

    async def _watch(self, watch: StreamWatch, loop) -> ResumeDue | WorkerGone | None:
        """A silent stream's worker, probed on its `alive` subject (shared/stream_watch.py); what
        is due once it is proven gone and nobody moved the stream."""
        effect = watch.tick(loop.time())
        if isinstance(effect, WorkerProbe):
            gone = False
            try:
                await self.nc.request(subjects.worker_alive(effect.worker_id), b"", timeout=WORKER_PROBE_TIMEOUT_S)
            except NoRespondersError:
                gone = True
            except Exception:  # a timeout (late, not gone), or this client's own connection
                pass
            watch.on_probe(gone, effect.sent_s)
            return None
        return effect

    async def _resume(self, request: schemas.GenerateRequest, inbox: str, box: Inbox, token_ids: list[int],
                      seq: int, json: bool, hdrs: dict[str, str]) -> tuple[str, Inbox]:
        """Resume a stream whose worker is gone and which nobody moved (shared/resume.py), once:
        stop its old generation wherever it might still run or be re-issued (that inbox only:
        workers refuse it from now on, a router drops it), then ask admission for the rest on a
        new inbox. The old one is read no more, so the reader sees one continuation."""
        rid = request.request_id or ""
        with contextlib.suppress(Exception):
            await self.abort(rid, reason="client_resume", reply_to=inbox)
        box.close()
        self._inboxes.pop(inbox, None)
        new, new_box = await self._open_inbox(rid)
        ask = ResumeAsk(request, inbox, list(token_ids), seq, json)
        await self.nc.publish(subjects.RESUME, codec.encode(ask, json=json), reply=new, headers=hdrs)
        self.resumes += 1
        log.info("stream_resumed", request_id=rid, tokens=len(token_ids), seq=seq)
        return new, new_box

    @staticmethod
    def _closed_error(rid: str, seq: int) -> schemas.Error:
        return schemas.Error(rid, CLIENT_CLOSED, "the client was closed while this stream was open", seq=seq)

    async def generate(self, request: schemas.GenerateRequest, **kwargs) -> Completion:
        """Submit and wait for the whole completion."""
        return await gather(request.request_id or "", self.stream(request, **kwargs))

    async def abort(self, request_id: str, reason: str = "client", reply_to: str = "") -> None:
        """`reply_to`: only the generation streaming there (a reused id's other one runs on)."""
        abort = schemas.Abort(request_id=request_id, reason=reason, reply_to=reply_to)
        await self.nc.publish(subjects.ABORT, codec.encode(abort))
        await self.nc.flush()
