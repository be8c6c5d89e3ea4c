"""What the router's migration core decides, performed (services/router/migration.py decides;
the shell, services/router/shell.py, holds the connection and the streams followed):

    monitor   every tick_s while a stream is followed: migration.tick → effects, each performed
    Probe     ask the worker's `status`: the requests it runs, or "no responders" (gone)
    Reissue   fence the old worker (`llm.v1.fence`), then place the request again elsewhere
    Fail      end the stream with the core's error event
    ProbeLease  is a silent client's lease holder still connected?
    Orphaned  abort a request whose client's lease lapsed
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from nats.errors import NoRespondersError
from tokenyard.services.router.migration import Fail, Orphaned, Probe, ProbeLease, Reissue
from tokenyard.shared import codec, natsutil, schemas, subjects, telemetry
from tokenyard.shared.schemas import MIGRATED

log = telemetry.logger("router")

PROBE_TIMEOUT_S = 0.5


async def monitor(shell) -> None:
    """Every `tick_s` while a stream is followed: the migration core's tick (death, orphans,
    re-issues). With nothing followed the tick has nothing to do, so the loop waits for the
    next one tracked instead of waking ten times a second. An outage it slept through is
    found by the connection's reconnect count, so every clock restarts as if it had been
    awake (MigrationCore.on_reconnected): from when the connection came back
    (natsutil.reconnected_at), not from when the loop next woke."""
    deaf = False
    reconnects = shell.nc.stats["reconnects"]
    while True:
        if not shell.migration.tracked:
            shell._tracking.clear()
            await shell._tracking.wait()
        await asyncio.sleep(shell.tick_s)
        if not shell.nc.is_connected:  # a NATS outage: silence proves nothing
            deaf = True
            continue
        if deaf or shell.nc.stats["reconnects"] != reconnects:
            deaf, reconnects = False, shell.nc.stats["reconnects"]
            # from the reconnect itself: one slept through while nothing was followed may be
            # long past, and its clocks (a gone client's lease) must not start again now
            shell.migration.on_reconnected(natsutil.reconnected_at(shell.nc) or time.time())
        for effect in shell.migration.tick(time.time()):
            try:
                await perform(shell, effect)
            except Exception:  # one failed publish must not drop the other effects
                log.exception("migration_effect_failed", effect=type(effect).__name__)

async def perform(shell, effect) -> None:
    match effect:
        case Probe(worker_id=wid):
            shell._spawn(probe(shell, wid))
        case Reissue():
            shell._spawn(reissue(shell, effect))
        case Fail(req=req, event=event):
            log.warning("stream_ended_by_router", request_id=req.request_id, sent=type(event).__name__,
                        message=getattr(event, "message", ""))
            await shell._unfollow(req.request_id)
            await shell.nc.publish(req.reply_to, codec.encode(event, json=req.json),
                                  headers=codec.content_headers(req.json))
        case ProbeLease():
            shell._spawn(probe_lease(shell, effect))
        case Orphaned(request_id=rid):
            log.info("orphan_aborted", request_id=rid)
            await shell._unfollow(rid)
            await shell.nc.publish(subjects.ABORT, codec.encode(schemas.Abort(rid, reason="orphaned")))

async def probe(shell, worker_id: str) -> None:
    try:
        msg = await shell.nc.request(subjects.worker_status(worker_id), b"", timeout=PROBE_TIMEOUT_S)
        running: set[str] | None = set(msgspec.msgpack.decode(msg.data, type=list[str]))
    except NoRespondersError:
        log.warning("worker_gone", worker=worker_id, detected_by="no_responders")
        shell.migration.on_no_responders(worker_id, time.time(), natsutil.reconnected_at(shell.nc))
        return
    except Exception:
        running = None
    shell.migration.on_probe(worker_id, running, time.time())

async def probe_lease(shell, effect: ProbeLease) -> None:
    """Is the silent lease's holder still connected? Only "no responders" says no (it
    holds no reply rights: a stalled holder and a live one both time out)."""
    try:
        await shell.nc.request(effect.subject, b"", timeout=PROBE_TIMEOUT_S)
    except NoRespondersError:
        log.info("client_gone", lease=effect.lease)
        shell.migration.on_lease_gone(effect.lease, time.time())
    except Exception:
        pass

async def reissue(shell, effect: Reissue) -> None:
    ar = effect.req
    # Fence: a worker wrongly thought dead stops sending (it keeps the id open).
    await shell.nc.publish(subjects.FENCE, codec.encode(
        schemas.Abort(ar.request_id, reason=MIGRATED, before_migration=ar.migrations)))
    decision, _ = await shell.place(ar, exclude=effect.exclude)
    log.info("migrated", request_id=ar.request_id, from_worker=effect.old_worker, outcome=decision.outcome,
             to_worker=decision.worker_id, resume_tokens=len(ar.resume_token_ids), migrations=ar.migrations)
    if decision.outcome == schemas.Outcome.ABORTED:  # aborted meanwhile (its client left): it ends here
        await shell._drop(ar.request_id, ended=True)
    if decision.outcome != schemas.Outcome.NO_CAPACITY:
        return
    fail = shell.migration.reissue_failed(ar.request_id, time.time())
    if fail is not None:
        await perform(shell, fail)
