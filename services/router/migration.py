"""Request migration, pure: the router replica that placed a request follows its stream and,
when its worker dies, re-issues it to another worker with the prompt plus the tokens already
sent (Dynamo's request migration), or ends it with a clean error.

    track(req, worker, now)            the request was placed on `worker`
    on_event(id, event, now)           a chunk / finished / error seen on its reply subject
    on_heartbeat(worker, now)          the worker is alive
    on_no_responders(worker, now, back) nobody listens on the worker's subjects: it is gone (not
                                       within resubscribe_grace_s of the router's own reconnect)
    on_probe(worker, running | None)   the worker's answer to a probe (None: no answer)
    on_lease(lease, now)               a client (an edge) is alive
    on_lease_gone(lease, now)          a lease probe found no responders: that client is gone
    expect(id) / adopt(req, worker, token_ids, next_seq, now)
                                       follow a request another router placed (that router is
                                       gone, its worker handed it here: shared/adoption.py); the
                                       events seen between the two are held, then replayed
    tick(now) → [Probe | Reissue | Fail | Orphaned | ProbeLease]   what the shell should do now

Death is detected three ways. (1) Heartbeat loss: a worker silent for `suspect_after_s` is
probed; one that answers no probe and stays silent for `dead_after_s` is dead. (2) No
responders: a probe or an offer to a worker with no subscription left (a killed process's
connection closes at once) proves it gone. (3) Stream silence: a request with no event for
`silence_s` gets its worker probed; a live worker that no longer runs it lost it.

A dead worker's request r is re-issued as r' with

    r'.resume_token_ids = the token ids of every chunk seen so far (in seq order)
    r'.resume_seq       = the seq the client expects next
    r'.migrations       = r.migrations + 1           (≤ max_migrations, else a 503 error)

to a worker chosen by the usual placement with the dead ones excluded; the worker prefills
prompt + resume and numbers its chunks on from resume_seq, so the client sees one stream
with no gap and no duplicate. If no worker takes it, the re-issue is retried each tick until
`reissue_deadline_s` after the death, then the request ends with a 503. With migration off,
the death ends each of its requests with a 503 error at once (within the detection time).

An orphan is a request whose client is gone: clients that hold a lease (an edge, a
TokenyardClient) publish it every `lease_interval_s`, use inboxes `_INBOX.<lease>.<n>` and
hold a subscription on `_INBOX.<lease>.alive` for as long as they live. A lease silent for
`orphan_after_s` is probed on that subject (ProbeLease): "no responders" proves the client's
connection gone, and its requests are aborted at once; any other answer, or none, means it
is still connected, only late (a CPU-starved edge's event loop can stall for seconds under
overload: aborting every request it holds then threw away all the fleet's work), and its
requests live on until the lease is silent for `stalled_client_s`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec
from tokenyard.shared import config, schemas
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.subjects import alive_subject, lease_of

LEASE_INTERVAL_S = 1.0
"""How often a lease holder says it is alive."""


@dataclass
class MigrationConfig:
    enabled: bool = True
    max_migrations: int = 3
    """Re-issues per request; a request whose workers keep dying ends with an error."""
    suspect_after_s: float = 5 * config.HEARTBEAT_INTERVAL_S
    """Heartbeat silence after which the worker is probed (5 missed heartbeats)."""
    dead_after_s: float = 3.0
    """Heartbeat silence, with no probe answered, after which the worker is declared dead.
    A killed process is found sooner, by no-responders on the probe."""
    resubscribe_grace_s: float = 6.25
    """After the router's own reconnect, how long neither a worker's "no responders" nor its
    silence proves it dead: the longest a worker's connection takes to come back once the server
    answers again — an attempt in flight to the silent address waited out — (shared.natsutil.
    RECONNECT_BOUND_S, pinned equal by tests/test_router_migration.py; tests/test_worker_back_late.py).
    A worker killed meanwhile is found this long after the reconnect, not dead_after_s."""
    silence_s: float = 10.0
    """A request with no event for this long gets its worker probed."""
    probe_every_s: float = 0.5
    """The least time between two probes of one worker."""
    reissue_deadline_s: float = 10.0
    """How long after the death a re-issue that found no worker is retried."""
    orphan_after_s: float = 3 * LEASE_INTERVAL_S
    """Lease silence after which the client is probed (`ProbeLease`); no responders: orphaned."""
    stalled_client_s: float = 30.0
    """Lease silence after which a client that is still connected (its probe not refused) is
    given up on all the same."""


@dataclass(frozen=True)
class Probe:
    worker_id: str


@dataclass(frozen=True)
class Reissue:
    """Place `req` (resume fields set) anywhere but `exclude`; fence `old_worker` first."""

    req: AdmittedRequest
    old_worker: str
    exclude: frozenset[str]


@dataclass(frozen=True)
class Fail:
    """Send `event` (an error, or the finished event of a request that was complete) to the
    request's reply subject; the request is no longer tracked."""

    req: AdmittedRequest
    event: schemas.Error | schemas.Finished


@dataclass(frozen=True)
class Orphaned:
    """Abort the request everywhere: its client is gone."""

    request_id: str


@dataclass(frozen=True)
class ProbeLease:
    """Ask `subject` (the lease holder's `…<lease>.alive`, from a request's inbox) whether
    anyone listens; the shell answers with `on_lease_gone` on no responders."""

    lease: str
    subject: str


Effect = Probe | Reissue | Fail | Orphaned | ProbeLease


@dataclass
class _Tracked:
    req: AdmittedRequest
    worker_id: str
    last_event_s: float
    token_ids: list[int] = field(default_factory=list)
    next_seq: int = 0
    lost_s: float | None = None
    """When its worker was found dead: a re-issue is due."""
    reissuing: bool = False
    """A Reissue is out; the shell answers with track() or reissue_failed()."""


@dataclass
class _Worker:
    seen_s: float
    probed_s: float = -1e18
    dead: bool = False


ENDED_REMEMBERED = 50_000
"""Streams whose end was seen, remembered so that a late `track` does not follow them again."""
LEASES_REMEMBERED = 50_000
"""Leases heard, at most (the least recently heard forgotten first): anyone may publish on
`llm.v1.lease.*`, and a flood of made-up leases would otherwise grow the map for 600 s. A
forgotten lease is unknown, and a request of an unknown lease is never taken for an orphan:
it runs on (at worst for nobody), it is not lost."""


class MigrationCore:
    def __init__(self, cfg: MigrationConfig | None = None):
        self.cfg = cfg or MigrationConfig()
        self.tracked: dict[str, _Tracked] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()
        """request id → reply subject of the streams whose terminal event was seen: an offer's
        reply may come after its stream's end (another subscription), and tracking it then
        would follow a finished request forever (and re-issue it when its worker stops)."""
        self.workers: dict[str, _Worker] = {}
        self.back_s = -math.inf
        """When this router's own connection last came back from an outage (`on_reconnected`)."""
        self.leases: dict[str, float] = {}
        """lease → when it was last heard."""
        self.lease_probed: dict[str, float] = {}
        """lease → when it was last probed (silent leases only)."""
        self.leases_gone: set[str] = set()
        """Leases whose holder's connection is proven gone (a probe found no responders)."""
        self.adopting: dict[str, list[tuple[schemas.StreamEvent, float]]] = {}
        """request id → the events seen on its reply subject while its state is asked (adoption)."""
        self.migrated = 0
        """Re-issues made (a metric)."""
        self.failed = 0
        """Requests ended with an error because their worker died."""

    # ── inputs ──

    def track(self, req: AdmittedRequest, worker_id: str, now: float) -> None:
        """Follow `req`, placed on `worker_id` ('' while it is being placed); not once its
        stream has ended."""
        if self.ended.get(req.request_id) == req.reply_to:
            return
        t = self.tracked.get(req.request_id)
        if t is None:
            t = self.tracked[req.request_id] = _Tracked(req, worker_id, now)
            t.token_ids = list(req.resume_token_ids)
            t.next_seq = req.resume_seq
        t.req, t.worker_id, t.last_event_s, t.lost_s, t.reissuing = req, worker_id, now, None, False
        if worker_id:  # '' = being placed: followed already, on no worker yet
            self.workers.setdefault(worker_id, _Worker(now)).dead = False

    def untrack(self, request_id: str, ended: bool = False) -> None:
        """No longer follow it; `ended` (its client aborted it): nor again, when an offer's reply
        comes after the abort (the offer was out when it came) — that stream sends no more events,
        so nothing would end its tracking but a probe's loss and a re-issue."""
        t = self.tracked.pop(request_id, None)
        if ended and t is not None:
            self._ended(request_id, t.req.reply_to)

    def kept(self) -> dict[str, int]:
        """The requests followed and being adopted, counted (shared/service.py)."""
        return {"tracked": len(self.tracked), "adopting": len(self.adopting)}

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        """The streams seen to end (the last ENDED_REMEMBERED) and the leases heard (for 600 s, the
        last LEASES_REMEMBERED)."""
        return {"ended": (len(self.ended), ENDED_REMEMBERED), "leases": (len(self.leases), LEASES_REMEMBERED)}

    def on_event(self, request_id: str, event: schemas.StreamEvent, now: float) -> None:
        t = self.tracked.get(request_id)
        if t is None:
            if request_id in self.adopting:
                self.adopting[request_id].append((event, now))
            return
        if isinstance(event, schemas.TERMINAL_EVENTS):
            del self.tracked[request_id]
            self._ended(request_id, t.req.reply_to)
            return
        t.last_event_s = now
        if isinstance(event, schemas.Chunk) and event.seq == t.next_seq:
            t.token_ids.extend(event.token_ids)
            t.next_seq += 1

    def expect(self, request_id: str) -> None:
        """About to adopt: hold the events seen from now until `adopt` (or `unexpect`)."""
        self.adopting.setdefault(request_id, [])

    def unexpect(self, request_id: str) -> None:
        self.adopting.pop(request_id, None)

    def adopt(self, req: AdmittedRequest, worker_id: str, token_ids: list[int], next_seq: int, now: float) -> None:
        """Follow `req`, running on `worker_id`, whose chunks up to `next_seq` carried
        `token_ids` (its worker's word); then the events held since `expect`, in order."""
        held = self.adopting.pop(req.request_id, [])
        if req.request_id in self.tracked:
            return
        self.ended.pop(req.request_id, None)
        self.track(req, worker_id, now)
        t = self.tracked[req.request_id]
        t.token_ids, t.next_seq = list(token_ids), next_seq
        for event, seen_s in held:
            self.on_event(req.request_id, event, seen_s)

    def on_heartbeat(self, worker_id: str, now: float) -> None:
        w = self.workers.setdefault(worker_id, _Worker(now))
        w.seen_s, w.dead = now, False  # alive (again: a restarted worker takes new work)

    def on_no_responders(self, worker_id: str, now: float, back_s: float | None = None) -> None:
        """Nobody listens on the worker's subjects: it is gone — unless this router's own
        connection came back from an outage (at `back_s`) less than resubscribe_grace_s ago. A worker
        still reconnecting has no subscription yet either (bench chaos seed 17: two streams
        re-issued 0.6 s after a bus outage while their worker, back a moment later, ran them on:
        two workers generating one tail). Then its silence decides, as for a probe unanswered."""
        if back_s is not None and now - back_s < self.cfg.resubscribe_grace_s:
            return
        self._dead(worker_id, now)

    def on_probe(self, worker_id: str, running: set[str] | None, now: float) -> None:
        """A probe's answer: the ids the worker runs, or None (timed out)."""
        w = self.workers.get(worker_id)
        if w is None or w.dead:
            return
        if running is None:
            if self._gone_quiet(w, now):
                self._dead(worker_id, now)
            return
        w.seen_s = max(w.seen_s, now)
        for t in self.tracked.values():
            if t.worker_id == worker_id and t.lost_s is None:
                if t.req.request_id in running:
                    t.last_event_s = max(t.last_event_s, now)
                elif now - t.last_event_s >= self.cfg.silence_s:
                    t.lost_s = now  # the worker lives but lost it (it restarted, or crashed inside)

    def alive(self, worker_id: str, now: float) -> bool:
        """Heard from within dead_after_s and not found dead: an offer it left unanswered may
        still be taken (it is slow, not gone)."""
        w = self.workers.get(worker_id)
        return w is not None and not w.dead and now - w.seen_s < self.cfg.dead_after_s

    def on_lease(self, lease: str, now: float) -> None:
        self.leases.pop(lease, None)  # to the end: the dict runs from least to most recently heard
        self.leases[lease] = now
        if len(self.leases) > LEASES_REMEMBERED:
            oldest = next(iter(self.leases))
            del self.leases[oldest]
            self.lease_probed.pop(oldest, None)
            self.leases_gone.discard(oldest)
        self.lease_probed.pop(lease, None)
        self.leases_gone.discard(lease)

    def on_lease_gone(self, lease: str, now: float) -> None:
        """A lease probe found no responders: the client's connection is gone — unless the
        lease was heard since the probe went out (`orphan_after_s` ago at most)."""
        if lease in self.leases and now - self.leases[lease] >= self.cfg.orphan_after_s:
            self.leases_gone.add(lease)

    def on_reconnected(self, now: float) -> None:
        """The router's own connection was down: what it did not hear says nothing about the
        workers or the clients, so every clock restarts now (no death, no orphan from it), and no
        worker is dead by its silence within resubscribe_grace_s: it may still be reconnecting."""
        self.back_s = max(self.back_s, now)
        for w in self.workers.values():
            w.seen_s = max(w.seen_s, now)
        for t in self.tracked.values():
            t.last_event_s = max(t.last_event_s, now)
        self.leases = {k: max(v, now) for k, v in self.leases.items()}

    # ── decisions ──

    def tick(self, now: float) -> list[Effect]:
        cfg = self.cfg
        out: list[Effect] = []
        busy = {t.worker_id for t in self.tracked.values() if t.lost_s is None and t.worker_id}
        for wid in sorted(busy):
            w = self.workers.get(wid)
            if w is None or w.dead:
                continue
            if self._gone_quiet(w, now):
                self._dead(wid, now)
            elif now - w.seen_s >= cfg.suspect_after_s or self._silent(wid, now):
                if now - w.probed_s >= cfg.probe_every_s:
                    w.probed_s = now
                    out.append(Probe(wid))
        dead = frozenset(wid for wid, w in self.workers.items() if w.dead)
        probes: dict[str, ProbeLease] = {}
        for rid in sorted(self.tracked):
            t = self.tracked[rid]
            lease = lease_of(t.req.reply_to)
            if lease and self._client_gone(lease, now):
                del self.tracked[rid]
                out.append(Orphaned(rid))
                continue
            if (lease and lease not in probes and lease in self.leases
                    and now - self.leases[lease] >= cfg.orphan_after_s
                    and now - self.lease_probed.get(lease, -math.inf) >= cfg.probe_every_s):
                probes[lease] = ProbeLease(lease, alive_subject(t.req.reply_to))
            if t.lost_s is not None and not t.reissuing:
                out.append(self._after_loss(t, dead, now))
        for lease, probe in probes.items():
            self.lease_probed[lease] = now
            out.append(probe)
        return out

    def reissue_failed(self, request_id: str, now: float) -> Fail | None:
        """No worker took the re-issue: try again next tick, or give up after the deadline."""
        t = self.tracked.get(request_id)
        if t is None or t.lost_s is None:
            return None
        t.reissuing = False
        if now - t.lost_s < self.cfg.reissue_deadline_s:
            return None
        return self._fail(t, f"worker {t.worker_id} died and no other worker took the request")

    def orphan(self, req: AdmittedRequest, now: float) -> bool:
        """A request about to be placed whose client is gone (it waited in the queue)."""
        lease = lease_of(req.reply_to)
        return bool(lease) and self._client_gone(lease, now)

    def forget_leases(self, now: float, after_s: float = 600.0) -> None:
        self.leases = {k: v for k, v in self.leases.items() if now - v < after_s}
        self.lease_probed = {k: v for k, v in self.lease_probed.items() if k in self.leases}
        self.leases_gone &= self.leases.keys()
        self.workers = {k: w for k, w in self.workers.items() if now - w.seen_s < after_s or not w.dead}

    # ── internals ──

    def _ended(self, request_id: str, reply_to: str) -> None:
        self.ended[request_id] = reply_to
        self.ended.move_to_end(request_id)
        while len(self.ended) > ENDED_REMEMBERED:
            self.ended.popitem(last=False)

    def _client_gone(self, lease: str, now: float) -> bool:
        """Its connection proven gone, or its lease silent past `stalled_client_s`."""
        heard = self.leases.get(lease)
        return heard is not None and (lease in self.leases_gone or now - heard >= self.cfg.stalled_client_s)

    def _silent(self, worker_id: str, now: float) -> bool:
        return any(
            t.worker_id == worker_id and now - t.last_event_s >= self.cfg.silence_s for t in self.tracked.values()
        )

    def _gone_quiet(self, w: _Worker, now: float) -> bool:
        """Silent dead_after_s, and not within resubscribe_grace_s of this router's own reconnect."""
        return now - w.seen_s >= self.cfg.dead_after_s and now - self.back_s >= self.cfg.resubscribe_grace_s

    def _dead(self, worker_id: str, now: float) -> None:
        w = self.workers.setdefault(worker_id, _Worker(now))
        w.dead = True
        for t in self.tracked.values():
            if t.worker_id == worker_id and t.lost_s is None:
                t.lost_s = now

    def _after_loss(self, t: _Tracked, dead: frozenset[str], now: float) -> Effect:
        req = t.req
        if not self.cfg.enabled:
            return self._fail(t, f"worker {t.worker_id} died (migration is off)")
        if req.migrations >= self.cfg.max_migrations:
            return self._fail(t, f"worker {t.worker_id} died; the request already moved {req.migrations} times")
        if len(t.token_ids) >= req.max_tokens:  # complete; only `finished` was lost
            del self.tracked[req.request_id]
            n = len(t.token_ids)
            usage = schemas.Usage(req.prompt_len, n, req.prompt_len + n)
            return Fail(req, schemas.Finished(req.request_id, t.next_seq, "length", usage))
        moved = msgspec.structs.replace(
            req, resume_token_ids=list(t.token_ids), resume_seq=t.next_seq, migrations=req.migrations + 1
        )
        t.reissuing = True
        self.migrated += 1
        return Reissue(moved, t.worker_id, dead | {t.worker_id})

    def _fail(self, t: _Tracked, why: str) -> Fail:
        self.tracked.pop(t.req.request_id, None)
        self.failed += 1
        return Fail(t.req, schemas.Error(t.req.request_id, 503, why, seq=t.next_seq))
