"""The worker's shell: binds an Engine and the WorkerCore to NATS.

* `llm.v1.worker.<id>.generate` (micro endpoint): the core accepts or refuses; an accepted
  request streams its engine outputs as numbered chunks, then `finished`, straight to the
  request's reply subject (the client's inbox or the edge), in the client's encoding.
* `llm.v1.abort` (fan-out): abort in the engine if the request runs here. `llm.v1.fence`
  (fan-out, routers only): the router moved it elsewhere (reason `migrated`); the rest of its
  outputs go nowhere. A `migrated` abort on `llm.v1.abort` is dropped: anyone may publish there.
* A migrated request (the router re-issued it after its worker died) runs as prompt + the
  tokens already sent, its chunks numbered on from where the client is (core.engine_request).
* A NATS outage (services/worker/outage.py): what the worker sends while disconnected
  (nats-py buffers it) goes out on reconnect, often before the clients have resubscribed
  their inboxes, and is lost to them. So the stream events sent while disconnected or until
  the replay, and those of the REPLAY_BEFORE_S before the disconnect was noticed, are sent
  once more REPLAY_AFTER_S after the reconnect (receivers drop the seqs they already have),
  and a stream's terminal event (finished / error) made meanwhile goes out only in the
  replay, after its chunks: `finished` is always the last thing a stream sends.
* `llm.v1.worker.<id>.control`: phase and drain from the macro-instance.
* `llm.v1.worker.<id>.status` (micro endpoint): the ids it runs, for a router's probe.
* Orphans (services/worker/leases.py): at each heartbeat tick, the leases of the requests it
  runs that went unproven for ORPHAN_AFTER_S are probed on their holders' `alive` subjects;
  "no responders" aborts that lease's requests here, whichever router placed them.
* Adoption (shared/adoption.py): the routers that placed them are probed the same way (a
  router's `alive` subject is its offer's reply prefix + `.alive`); a gone router's requests
  are handed to a surviving one on `llm.v1.adopt`, which asks their state on
  `llm.v1.worker.<id>.state` and is followed once its reply names them; each message fits the
  server's max payload (a hand-over goes in pieces, shared/adoption.py). Where that reply is
  lost, the router told the state is asked which it adopted (`llm.v1.router.<id>.adopted`)
  before any of them is handed over again.
* Every `heartbeat_s`: a Heartbeat on `llm.v1.hb.<id>`; KV events on `llm.v1.kv.<id>` as
  soon as a step made some (polled every `kv_poll_s` while a generation runs; with none
  running, at each heartbeat: an idle worker's 20 ms poll found nothing 50 times a second, and
  a vLLM engine's last events, which come on their own socket, may trail its last output).
The span of a generation carries OpenTelemetry GenAI attributes (model, input and output
tokens, time to first token).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.micro.request import Request
from nats.micro.service import Service
from tokenyard.services.worker import handover
from tokenyard.services.worker.core import WorkerConfig, WorkerCore, engine_request
from tokenyard.services.worker.engine import Engine
from tokenyard.services.worker.leases import LeaseProbe
from tokenyard.services.worker.outage import REPLAY_AFTER_S, REPLAY_BEFORE_S, OutageReplay
from tokenyard.shared import codec, config, nats_internals, schemas, subjects, telemetry
from tokenyard.shared.adoption import message_room
from tokenyard.shared.eager import eager_task
from tokenyard.shared.metrics import WorkerMetrics
from tokenyard.shared.slo import OfferPrefill
from tokenyard.shared.subjects import alive_subject
from tokenyard.shared.tokenizer import Tokenizer

log = telemetry.logger("worker")

LEG_ROUTE_TIMEOUT_S = 5.0
"""How long a P/D decode leg waits for the router's answer (the queue's route timeout)."""

REPLY_HOLD_S = 0.002
"""How long the answer to an offer it took waits for the request's first event, and leaves right
behind it: the first token is written first, alone and at once (nats_internals.send_now), and the
answer follows on nats-py's flusher's turn — on the first token's path neither the answer's own
write nor the router's reading of it comes first. A first event that takes longer (a real
engine's prefill) finds the answer gone alone at this bound; a refusal is answered at once."""

LEASE_PROBE_TIMEOUT_S = 1.0
"""How long a lease probe waits: "no responders" comes back within a round trip; a live
holder answers nothing (its subscription is the answer), so the wait ends in a timeout."""

REPLAY_SLICE = 256
"""Replayed events published between two turns of the event loop."""
REPLAY_POLL_S = 0.1
"""While a due replay waits for the connection to come back: how often it looks."""


class WorkerShell:
    kind = "worker"

    def __init__(
        self,
        cfg: WorkerConfig,
        engine: Engine,
        tokenizer: Tokenizer,
        heartbeat_s: float = config.HEARTBEAT_INTERVAL_S,
        kv_poll_s: float = 0.02,
    ):
        self.core = WorkerCore(cfg, tokenizer)
        self.engine = engine
        self.instance_id = cfg.worker_id
        self.metrics = WorkerMetrics(cfg.worker_id, cfg.model)
        self.heartbeat_s = heartbeat_s
        self.kv_poll_s = kv_poll_s
        self._streams: dict[str, asyncio.Task] = {}
        self._timers: list[asyncio.Task] = []
        self._running = asyncio.Event()
        """Set when a generation starts: wakes the KV poll from its idle wait."""
        self.outage = OutageReplay(after_s=REPLAY_AFTER_S, before_s=REPLAY_BEFORE_S)
        self._replay_task: asyncio.Task | None = None
        self._lease_reconnects = 0
        self._lease_probes: set[asyncio.Task] = set()

    @property
    def generating(self) -> list[str]:
        """The ids of the requests whose streams run here (until each stream's last event is sent)."""
        return list(self._streams)

    def kept(self) -> dict[str, int]:
        """Per-request state here, counted (shared/service.py): 0 once its generations ended."""
        s = self.engine.stats()
        return {"streams": len(self.core.streams), "stream_tasks": len(self._streams),
                "lease_probes": len(self._lease_probes), "engine_running": s.running, "engine_waiting": s.waiting}

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        return self.core.remembered()

    @property
    def kv_poll_awake(self) -> bool:
        """Whether the KV poll runs; it sleeps while no generation runs (an idle worker's KV
        events go out with its heartbeats)."""
        return self._running.is_set()

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = nc
        self._lease_reconnects = nc.stats["reconnects"]
        wid = self.core.cfg.worker_id
        await self.engine.start()
        await nc.subscribe(subjects.ABORT, cb=self._on_abort)
        await nc.subscribe(subjects.FENCE, cb=self._on_fence)
        await nc.subscribe(subjects.worker_control(wid), cb=self._on_control)
        await nc.subscribe(subjects.worker_alive(wid), cb=_answer_alive)  # a client's probe: being here is the answer
        await service.add_endpoint(name="generate", subject=subjects.worker_generate(wid), handler=self.on_generate)
        nats_internals.handle_directly(service, subjects.worker_generate(wid))  # an offer's handler starts in the reader's turn
        await service.add_endpoint(name="status", subject=subjects.worker_status(wid), handler=self._on_status)
        await service.add_endpoint(name="state", subject=subjects.worker_state(wid), handler=functools.partial(handover.on_state, self))
        await self._publish_heartbeat()
        self._timers = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(self._kv_loop())]

    async def stop(self) -> None:
        """Drain: refuse new work, let running generations finish, then stop the engine."""
        self.core.draining = True
        await self._publish_heartbeat()
        if self._streams:
            await asyncio.gather(*self._streams.values(), return_exceptions=True)
        for t in self._timers:
            t.cancel()
        await self._publish_kv_events()
        await self.engine.stop()

    async def on_generate(self, req: Request) -> None:
        """The generate endpoint's handler: one offer, answered (an accepted one as its stream
        starts, see `OfferAnswer`); public as the seam tests hand offers to, or wrap to delay them."""
        received_ns = time.time_ns()
        try:
            ar = codec.decode(req.data, schemas.AdmittedRequest)
        except codec.DecodeError as e:
            await req.respond(codec.encode(schemas.GenerateReply("", False, f"bad request: {e}")))
            return
        prefill = OfferPrefill.parse((req.headers or {}).get(subjects.OFFER_PREFILL_HEADER))
        stats = self.engine.stats()
        reply, start = self.core.offer(ar, stats, prefill)
        if start:
            router = handover.asker_inbox(req)  # the placing router's request inbox: its prefix lives with its connection
            self.core.placed_by(ar.request_id, alive_subject(router) if router else "")  # answered with its first event, or at REPLY_HOLD_S (the handler returns at once)
            answer = OfferAnswer(req, codec.encode(reply))
            timer = asyncio.get_running_loop().call_later(REPLY_HOLD_S, answer.send_soon)
            task = eager_task(self.generate(ar, req.headers, received_ns, answer))  # into the engine in this turn
            self._streams[ar.request_id] = task
            self._running.set()
            task.add_done_callback(lambda _t, rid=ar.request_id: self._streams.pop(rid, None))
            task.add_done_callback(lambda _t: (timer.cancel(), answer.send_soon()))
            return
        await req.respond(codec.encode(reply))
        if reply.reason == "saturated":
            log.debug("offer_refused", request_id=ar.request_id, **self.core.refusal_terms(stats, ar.priority, prefill))
        if reply.reason == schemas.Outcome.DUPLICATE:  # an id reused by another request: say so
            error = self.core.reused_id_error(ar)
            await self.nc.publish(ar.reply_to, codec.encode(error, json=ar.json), headers=codec.content_headers(ar.json))

    async def generate(self, ar: schemas.AdmittedRequest, headers: dict[str, str] | None,
                        received_ns: int = 0, answer: OfferAnswer | None = None) -> None:
        """One accepted request's stream, engine output to events on its reply subject.
        `received_ns`: when the offer came (wall clock), for the hop profile; `answer`: the
        offer's, sent (if not yet) just before the stream's first event, in the same write."""
        subject = subjects.worker_generate(self.core.cfg.worker_id)
        attrs = {
            "gen_ai.operation.name": "chat" if ar.kind == "chat" else "text_completion",
            "gen_ai.system": self.engine.name,
            "gen_ai.request.model": ar.model,
            "gen_ai.request.max_tokens": ar.max_tokens,
            "gen_ai.usage.input_tokens": ar.prompt_len,
            "tokenyard.worker_id": self.core.cfg.worker_id,
            "tokenyard.received_ns": received_ns,
        }
        # MessagePack is the default and is told from JSON by its first byte: a header on every
        # chunk would double the publish cost (8.5 vs 4.2 µs), so only JSON streams carry one.
        hdrs = codec.content_headers(True) if ar.json else None
        with telemetry.span(self.kind, "process", subject, headers, request_id=ar.request_id, attributes=attrs) as span:
            t0 = time.monotonic()
            ttft_ms, first = None, False
            try:
                async for out in self.engine.generate(engine_request(ar)):
                    for event in self.core.on_output(out):
                        if isinstance(event, schemas.Chunk) and ttft_ms is None:
                            ttft_ms = (time.monotonic() - t0) * 1000.0
                            span.set_attribute("gen_ai.server.time_to_first_token", ttft_ms / 1000.0)
                            first = True
                        if isinstance(event, schemas.Finished):
                            event.ttft_ms = ttft_ms
                            span.set_attribute("gen_ai.usage.output_tokens", event.usage.completion_tokens)
                            span.set_attribute("gen_ai.response.finish_reasons", [event.finish_reason])
                            self.metrics.observe_finished(
                                None if ttft_ms is None else ttft_ms / 1000.0, time.monotonic() - t0,
                                event.usage.prompt_tokens, event.usage.completion_tokens, event.finish_reason)
                            await self._heartbeat_if_decodes_ended()
                        if answer is not None and not first:  # the router's answer (once), then the event
                            await answer.send()
                        await self._send(ar.reply_to, codec.encode(event, json=ar.json), hdrs,
                                         terminal=isinstance(event, schemas.TERMINAL_EVENTS))
                        if first:  # handed to NATS: where the hop profile's last segment starts
                            # written now, not on nats-py's flusher's turn behind the rest of this
                            # step (the next event's work); the router's answer after it
                            nats_internals.send_now(self.nc)
                            if answer is not None:
                                await answer.send()
                            span.set_attribute("tokenyard.first_event_ns", time.time_ns())
                            first = False
                if self._handed_off(ar.request_id):
                    await self._send_decode_leg(ar, hdrs)
            except Exception as e:
                log.exception("generation_failed", request_id=ar.request_id)
                self.core.streams.pop(ar.request_id, None)
                error = schemas.Error(ar.request_id, 500, f"engine failed: {e!r}")
                if answer is not None:
                    await answer.send()
                await self._send(ar.reply_to, codec.encode(error, json=ar.json), hdrs, terminal=True)

    async def _send(self, subject: str, data: bytes, headers: dict[str, str] | None, *, terminal: bool) -> None:
        """Publish a stream event, or hold it for the replay while the connection is unsure."""
        self.check_reconnect()
        if self.outage.send(time.monotonic(), self.nc.is_connected, (subject, data, headers), terminal):
            await self.nc.publish(subject, data, headers=headers)

    def check_reconnect(self) -> None:
        """Notice a reconnect (nats-py's count) and start the replay; every send and heartbeat
        tick runs it."""
        if self.outage.observe(time.monotonic(), self.nc.stats["reconnects"]) and (
            self._replay_task is None or self._replay_task.done()
        ):
            self._replay_task = asyncio.create_task(self._replay_when_due())

    async def _replay_when_due(self) -> None:
        """One task per outage: wait until the replay is due, then publish it batch by batch
        until a batch comes back empty (outage.take); while the connection is down again,
        wait for the next reconnect, which makes the replay due anew."""
        sent = 0
        while self.outage.pending:
            self.check_reconnect()
            wait = self.outage.due_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            batch = self.outage.take(time.monotonic(), self.nc.is_connected)
            if not batch:
                if self.outage.pending:  # disconnected again
                    await asyncio.sleep(REPLAY_POLL_S)
                continue
            for i, (subject, data, headers) in enumerate(batch, 1):
                with contextlib.suppress(Exception):
                    await self.nc.publish(subject, data, headers=headers)
                if i % REPLAY_SLICE == 0:  # let heartbeats and the engine run: a replay is ~10k events
                    await asyncio.sleep(0)
            sent += len(batch)
        log.warning("replay_after_reconnect", events=sent)

    async def _on_status(self, req: Request) -> None:
        """A router's probe: the ids of the requests running here."""
        await req.respond(msgspec.msgpack.encode(self.core.running_ids()))

    def _handed_off(self, request_id: str) -> bool:
        take = getattr(self.engine, "take_hand_off", None)
        return take is not None and take(request_id) is not None

    async def _send_decode_leg(self, ar: schemas.AdmittedRequest, hdrs) -> None:
        """Spatial P/D: the first token went out from here; the router places the rest on a
        decode worker, which streams on to the same reply subject (numbered from 1)."""
        self.core.streams.pop(ar.request_id, None)
        leg = msgspec.structs.replace(ar, kv_from=self.core.cfg.worker_id)
        try:
            msg = await self.nc.request(subjects.ROUTE, codec.encode(leg), timeout=LEG_ROUTE_TIMEOUT_S)
            decision = codec.decode(msg.data, schemas.RouteDecision)
        except Exception as e:  # no router answered
            decision = schemas.RouteDecision(ar.request_id, schemas.Outcome.NO_CAPACITY, reason=repr(e))
        if decision.outcome != schemas.Outcome.ROUTED:
            log.warning("decode_leg_unplaced", request_id=ar.request_id, reason=decision.reason)
            error = schemas.Error(ar.request_id, 503, f"no decode worker took the request: {decision.reason}")
            await self._send(ar.reply_to, codec.encode(error, json=ar.json), hdrs, terminal=True)

    async def _on_abort(self, msg: Msg, fence: bool = False) -> None:
        """An abort (`llm.v1.abort`, anyone's) or the router's fence (`llm.v1.fence`, `fence`):
        a `migrated` reason counts only on the fence, which no client may publish."""
        try:
            abort = codec.decode(msg.data, schemas.Abort, json=codec.is_json(msg.headers))
        except codec.DecodeError:
            return
        if (abort.reason == schemas.MIGRATED) is not fence:
            log.warning("abort_on_the_wrong_subject", request_id=abort.request_id[:64], reason=abort.reason[:64],
                        subject=msg.subject)
            return
        if self.core.on_abort(abort.request_id, abort.reason, abort.reply_to, abort.before_migration):
            self.metrics.observe_abort(abort.reason)
            await self.engine.abort(abort.request_id)

    async def _on_fence(self, msg: Msg) -> None:
        await self._on_abort(msg, fence=True)

    async def _on_control(self, msg: Msg) -> None:
        try:
            self.core.on_control(codec.decode(msg.data, schemas.WorkerControl))
        except (codec.DecodeError, ValueError) as e:
            log.warning("bad_control", error=str(e))
            return
        await self._publish_heartbeat()

    def _sync_phase(self) -> None:
        """EcoServe: run the engine in the phase the core says (engines without phases, such
        as vLLM's, only stop taking new requests in their decode phase); spatial P/D: a
        prefill worker's engine hands requests off (the simulated engine's; vLLM's needs a KV
        connector, not wired here)."""
        set_phase = getattr(self.engine, "set_phase", None)
        if set_phase is not None:
            set_phase(self.core.engine_phase(self.engine.stats()))
        set_hand_off = getattr(self.engine, "set_hand_off", None)
        if set_hand_off is not None:
            set_hand_off(self.core.hands_off)

    async def _publish_heartbeat(self) -> None:
        self._sync_phase()
        hb = self.core.heartbeat(self.engine.stats(), time.time(), interval_s=self.heartbeat_s)
        self.metrics.heartbeat = hb
        await self.nc.publish(subjects.heartbeat(self.core.cfg.worker_id), codec.encode(hb))

    async def _heartbeat_if_decodes_ended(self) -> None:
        """The last running decode just ended: say so now, not at the next tick. The last
        heartbeat still shows its TPOT slack, which holds prefill back (flow control's decode
        term) and lets admission refuse a prompt for want of decode capacity, for a decode
        that is gone; its client, answered right after this, may send its next request at once."""
        last = self.metrics.heartbeat
        if last is not None and last.stats.tpot_slack_ms is not None and self.engine.stats().tpot_slack_ms is None:
            with contextlib.suppress(Exception):
                await self._publish_heartbeat()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            self.check_reconnect()
            if not self._running.is_set():  # the KV poll sleeps: events that trail it go now
                with contextlib.suppress(Exception):  # (a failure here costs no heartbeat)
                    await self._publish_kv_events()
            with contextlib.suppress(Exception):
                await self._publish_heartbeat()
            self.probe_leases()

    def probe_leases(self) -> None:
        """Send the lease probes due now (WorkerCore.lease_probes); none while disconnected, and
        every lease's clock restarts at a reconnect (its holder may not have resubscribed yet)."""
        if not self.nc.is_connected:
            return
        now = time.monotonic()
        if self.nc.stats["reconnects"] != self._lease_reconnects:
            self._lease_reconnects = self.nc.stats["reconnects"]
            self.core.leases.on_reconnected(now)
            self.core.routers.on_reconnected(now)  # a router, too, may not have resubscribed yet
            self.core.adopters.on_reconnected(now)
        probes = [self._probe_lease(p) for p in self.core.lease_probes(now)]
        probes += [handover.probe_router(self, p) for p in self.core.router_probes(now)]
        probes += [handover.ask_adopter(self, a) for a in self.core.adopter_asks(now, message_room(self.nc.max_payload))]
        for probe in probes:
            task = asyncio.create_task(probe)
            self._lease_probes.add(task)
            task.add_done_callback(self._lease_probes.discard)

    async def _gone(self, subject: str) -> bool:
        """Whether nobody listens on `subject`; an answer or a timeout: someone does, or may."""
        try:
            await self.nc.request(subject, b"", timeout=LEASE_PROBE_TIMEOUT_S)
        except NoRespondersError:
            return True
        except Exception:
            pass
        return False

    async def _probe_lease(self, probe: LeaseProbe) -> None:
        """Only "no responders" says the holder is gone; an answer or a timeout, alive-or-late."""
        for rid in self.core.on_lease_answer(probe.lease, await self._gone(probe.subject), probe.sent_s):
            log.info("orphan_stopped", request_id=rid, lease=probe.lease)
            self.metrics.observe_abort("orphaned")
            await self.engine.abort(rid)

    async def _publish_kv_events(self) -> None:
        events = self.engine.drain_kv_events()
        if events:
            batch = schemas.KVEventBatch(ts=time.time(), events=events)
            await self.nc.publish(subjects.kv_events(self.core.cfg.worker_id), codec.encode(batch))

    async def _kv_loop(self) -> None:
        """Every `kv_poll_s` while a generation runs, and once after the last one ends (its
        final step's events); then asleep until the next generation starts (the heartbeat
        loop publishes what comes meanwhile)."""
        while True:
            if not self._streams:
                self._running.clear()
                await self._running.wait()
            await asyncio.sleep(self.kv_poll_s)
            with contextlib.suppress(Exception):
                await self._publish_kv_events()


async def _answer_alive(msg) -> None:
    if subjects.is_inbox(msg.reply):  # an empty answer elsewhere could be a JetStream API call's
        await msg.respond(b"")
    elif msg.reply:
        log.warning("alive_reply_not_an_inbox", reply=msg.reply[:200])


class OfferAnswer:
    """The answer to an offer the worker took, sent once: by the generation just after its first
    token (before any other first event), or alone when REPLY_HOLD_S passes first (the timer),
    or when the generation ends without an event."""

    __slots__ = ("req", "data", "sent", "sending")

    def __init__(self, req: Request, data: bytes):
        self.req = req
        self.data = data
        self.sent = False
        self.sending: asyncio.Future | None = None
        """The timer's send, kept referenced until it is done (a bare task may be collected)."""

    async def send(self) -> None:
        if self.sent:
            return
        self.sent = True
        with contextlib.suppress(Exception):  # a lost answer: the router asks again (re-offer)
            await self.req.respond(self.data)

    def send_soon(self) -> None:
        if not self.sent:
            self.sending = asyncio.ensure_future(self.send())
