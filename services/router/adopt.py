"""A router adopts streams whose placing router is gone (shared/adoption.py): their worker found
that router's connection gone and asks `llm.v1.adopt` (this service's queue group).

    for each request:  migration.expect(id); follow its reply subject (events are held)
    flush; ask the worker's `state` for them → [StreamState] (the worker follows us from now)
    for each state:    migration.adopt(req, worker, token ids, next seq) (the held events replay)
    the rest (ended meanwhile): no longer followed
    answer AdoptReply(adopted ids)

Following before asking is what leaves no chunk between the state and the stream. A request
this replica follows already is asked about all the same (the worker then follows this one).
"""

from __future__ import annotations

import time

from nats.aio.msg import Msg
from tokenyard.shared import codec, subjects, telemetry
from tokenyard.shared.adoption import AdoptAsk, AdoptReply, StateAsk, StreamState

log = telemetry.logger("router")

STATE_TIMEOUT_S = 2.0
"""How long the worker's state may take (it answers from memory)."""


async def on_adopt(shell, msg: Msg) -> None:
    """Adopt what the state names; on any failure (a follow, the flush, the state ask) undo
    exactly the expects and follows made here, and answer what was adopted (perhaps nothing):
    the worker hands the rest over again at a later probe."""
    try:
        ask = codec.decode(msg.data, AdoptAsk)
    except codec.DecodeError:
        return
    migration = shell.migration
    reqs = {r.request_id: r for r in ask.requests}
    expected: list[str] = []
    adopted: list[str] = []
    try:
        for rid in reqs:
            if rid not in migration.tracked and rid not in migration.adopting:  # not another ask's
                migration.expect(rid)
                expected.append(rid)
                await shell._follow(reqs[rid])
        await shell.nc.flush()
        state_ask = codec.encode(StateAsk(list(reqs), ask.handover))  # for that hand-over only
        reply = await shell.nc.request(subjects.worker_state(ask.worker_id), state_ask,
                                       timeout=STATE_TIMEOUT_S)
        now = time.time()
        for st in codec.decode(reply.data, list[StreamState]):
            if st.request_id in reqs:
                migration.adopt(reqs[st.request_id], ask.worker_id, st.token_ids, st.next_seq, now)
                adopted.append(st.request_id)
    except Exception as e:
        log.warning("adopt_failed", worker=ask.worker_id, streams=len(reqs), adopted=len(adopted), error=repr(e))
    finally:
        done = set(adopted)
        for rid in expected:
            if rid not in done:
                migration.unexpect(rid)
                await shell._unfollow(rid)
    if adopted:
        shell._tracking.set()
        log.info("adopted", worker=ask.worker_id, streams=len(adopted))
    if msg.reply:
        await msg.respond(codec.encode(AdoptReply(adopted)))
