"""A router adopts streams whose placing router is gone (shared/adoption.py): their worker found
that router's connection gone and asks `llm.v1.adopt` (this service's queue group).

    for each request:  migration.expect(id); follow its reply subject (events are held)
    flush; ask the worker's `state` for them → [StreamState] (the worker follows us from now)
    for each state:    migration.adopt(req, worker, token ids, next seq) (the held events replay)
    the rest (ended meanwhile): no longer followed
    answer AdoptReply(adopted ids)

Following before asking is what leaves no chunk between the state and the stream. A request
this replica follows already is asked about all the same (the worker then follows this one).

The StateAsk names this router's id: if the AdoptReply is lost, the worker asks
`llm.v1.router.<id>.adopted` (on_adopted_ask) which of those streams this router follows, and
hands over again only the others. The answer comes from the migration tracking once every
adoption of those streams under way here has ended (`shell.adoptions`): a stream still being
adopted may yet be followed, and "not followed" then would let a second router follow it too.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.msg import Msg
from tokenyard.shared import codec, subjects, telemetry
from tokenyard.shared.adoption import AdoptAsk, AdoptedAsk, AdoptReply, StateAsk, StreamState

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
    ended = asyncio.Event()
    try:
        for rid in reqs:
            if rid not in migration.tracked and rid not in migration.adopting:  # not another ask's
                migration.expect(rid)
                expected.append(rid)
                shell.adoptions[rid] = ended
                await shell._follow(reqs[rid])
        await shell.nc.flush()
        state_ask = codec.encode(StateAsk(list(reqs), ask.handover, shell.instance_id))  # for that hand-over only
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
            if shell.adoptions.get(rid) is ended:
                del shell.adoptions[rid]
        ended.set()
    if adopted:
        shell._tracking.set()
        log.info("adopted", worker=ask.worker_id, streams=len(adopted))
    if msg.reply:
        await msg.respond(codec.encode(AdoptReply(adopted)))


async def on_adopted_ask(shell, msg: Msg) -> None:
    """A worker whose AdoptReply from this router was lost: which of its streams does this router
    follow? Answered once no adoption of them is under way here (at most STATE_TIMEOUT_S more;
    past that, no answer: the worker asks again later)."""
    try:
        ask = codec.decode(msg.data, AdoptedAsk)
    except codec.DecodeError as e:
        log.warning("bad_adopted_ask", error=str(e))
        return
    under_way = {shell.adoptions[rid] for rid in ask.request_ids if rid in shell.adoptions}
    if under_way:
        try:
            async with asyncio.timeout(STATE_TIMEOUT_S):
                for ended in under_way:
                    await ended.wait()
        except TimeoutError:
            return
    tracked = shell.migration.tracked
    followed = [rid for rid in ask.request_ids if rid in tracked and tracked[rid].worker_id == ask.worker_id]
    log.info("adopted_asked", worker=ask.worker_id, asked=len(ask.request_ids), followed=len(followed))
    if msg.reply:
        await msg.respond(codec.encode(AdoptReply(followed)))
