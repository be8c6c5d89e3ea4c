"""The worker's side of adoption, its I/O (shared/adoption.py; the decisions are WorkerCore's):

    probe_router   a placing router's probe: gone → hand its streams over on `llm.v1.adopt`, piece
                   by piece; a piece's AdoptReply → adoption_done, none → adoption_lost
    on_state       a StateAsk from the adopter → the streams' state (stream_states), remembering
                   the asker (its `alive` subject) and where it answers (`llm.v1.router.<id>.adopted`)
    ask_adopter    a stream whose state was told but whose AdoptReply was lost: ask that router
                   which it follows (AdoptedAsk) → on_adopter_answer

A hand-over's reply can be lost after its adopter followed the streams: handing them over again
then would have two routers follow one stream (both re-issue it when the worker dies), so the
adopter is asked first, and only what it does not follow, or all once it is proven gone, is
handed over again.
"""

from __future__ import annotations

from typing import Protocol

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.micro.request import Request
from tokenyard.services.worker.core import WorkerCore
from tokenyard.services.worker.handover_core import AdopterAsk
from tokenyard.services.worker.leases import LeaseProbe
from tokenyard.shared import codec, subjects, telemetry
from tokenyard.shared.adoption import AdoptReply, StateAsk, message_room
from tokenyard.shared.subjects import alive_subject

log = telemetry.logger("worker")

ADOPT_TIMEOUT_S = 5.0
"""How long a hand-over waits for a router to adopt (it subscribes, then asks the state)."""

ADOPTED_TIMEOUT_S = 1.0
"""How long an ask to an adopter whose AdoptReply was lost waits (it answers from memory once
any adoption of those streams under way has ended); no answer: asked again ORPHAN_AFTER_S on."""


class Shell(Protocol):
    """What these use of WorkerShell."""

    core: WorkerCore
    nc: Client

    async def _gone(self, subject: str) -> bool: ...


async def probe_router(shell: Shell, probe: LeaseProbe) -> None:
    """A placing router gone: hand its requests here to another (adoption); what none took,
    the next probe tries again."""
    core, nc = shell.core, shell.nc
    reqs = core.on_router_answer(probe.lease, await shell._gone(probe.subject), probe.sent_s)
    if not reqs:
        return
    serial = core.streams[reqs[0].request_id].handing
    try:  # piece by piece, each a whole hand-over; what none took waits for a later probe
        for ask in core.adopt_asks(reqs, message_room(nc.max_payload)):
            ids = [r.request_id for r in ask.requests]
            try:
                msg = await nc.request(subjects.ADOPT, codec.encode(ask), timeout=ADOPT_TIMEOUT_S)
                adopted = codec.decode(msg.data, AdoptReply).adopted
            except Exception as e:  # a state told meanwhile: its adopter is asked (ask_adopter)
                log.warning("adoption_failed", gone=probe.lease, streams=len(ids), error=repr(e))
                core.adoption_lost(serial, ids)
                if isinstance(e, (NoRespondersError, TimeoutError)):
                    break  # no router took it now: the rest wait too (not piled onto a slow one)
                continue  # this piece alone (too big to send, a bad answer): on to the next
            core.adoption_done(serial, ids, adopted)  # followed from now: not before the adopter committed
            log.info("streams_adopted", gone=probe.lease, adopted=len(adopted), asked=len(ids))
    finally:  # the pieces not sent
        core.adoption_lost(serial, [r.request_id for r in reqs])


async def ask_adopter(shell: Shell, a: AdopterAsk) -> None:
    """Ask a router told streams' state, whose AdoptReply was lost, which of them it follows;
    only "no responders" (twice) says it is gone, a timeout or a bad answer says nothing."""
    adopted, gone = None, False
    try:
        msg = await shell.nc.request(a.probe.subject, codec.encode(a.ask), timeout=ADOPTED_TIMEOUT_S)
        adopted = codec.decode(msg.data, AdoptReply).adopted
    except NoRespondersError:
        gone = True
    except Exception as e:
        log.warning("adopter_unanswered", adopter=a.probe.lease, streams=len(a.ask.request_ids), error=repr(e))
    shell.core.on_adopter_answer(a, adopted, gone)
    log.info("adopter_answered", adopter=a.probe.lease, asked=len(a.ask.request_ids), gone=gone,
             adopted=None if adopted is None else len(adopted))


async def on_state(shell: Shell, req: Request) -> None:
    """A router adopting streams here: their state; it is followed once its reply says so, or
    (that reply lost) once it answers that it adopted them, on the subject its ask names. An
    ask that cannot be read, or names no router id, is told nothing."""
    asker = asker_inbox(req)
    if not asker:
        return
    try:
        ask = codec.decode(req.data, StateAsk)
        at = subjects.router_adopted(ask.router_id)
    except (*codec.DecodeError, ValueError) as e:
        log.warning("bad_state_ask", asker=asker, error=str(e))
        ask, at = StateAsk([], 0), ""
    states = shell.core.stream_states(ask.request_ids, alive_subject(asker), at, ask.handover,
                                      message_room(shell.nc.max_payload))
    await req.respond(codec.encode(states))


def asker_inbox(req: Request) -> str:
    """The reply subject of a micro endpoint's request (nats.micro keeps it on its message);
    '' when there is none (a test's stand-in)."""
    reply = getattr(getattr(req, "_msg", None), "reply", "")
    return reply if isinstance(reply, str) else ""
