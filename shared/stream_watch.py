"""A client's watch over one running stream's worker, pure: when the stream goes silent, prove
its worker gone the way a worker proves a router gone (services/worker/leases.py), then resume
the stream once (shared/resume.py), or end it with a clear error, instead of a silence until
the idle timeout.

    on_chunk(now, worker_id)   a chunk arrived; `worker_id` when it names its worker (the first
                               chunk each worker sends for the stream: a migrated one names its new one)
    on_event(now)              any other event arrived (the stream is alive)
    tick(now) → WorkerProbe | ResumeDue | WorkerGone | None
    on_probe(gone, sent_s)     the probe sent at `sent_s`: "no responders" (gone) or any other outcome
    on_resumed(now)            the shell resumed it: a new generation, its worker not yet named
    on_reconnected(now)        the client's own connection came back

    silence bound  b = min(CAP_S, max(FLOOR_S, GAP_FACTOR × the longest gap between two chunks))

A stream that named its worker and has heard nothing for b (since its last event, or since its
worker was last proven alive) gets one probe on the worker's `alive` subject (one at a time).
Only "no responders" twice, on probes at least FLOOR_S apart with no event and no other answer
between, proves the worker gone (one alone may be the worker's brief reconnect); an answer or a
timeout proves it alive-or-late as of the probe's sending, and the clock restarts there.

A router that follows the stream and lives finds the worker gone first (its probe of a worker
silent for 5 heartbeats, 0.5 s, meets "no responders") and re-issues it at once; its chunks
reset all of this. A proof with no chunk since (at least 2 × FLOOR_S after the last one) means
nobody moved it: its placing router died before the worker could hand it over (3-9 s after
that death). It is resumed then (`ResumeDue`), once. If a resumed stream's worker is proven
gone too, a router placed that generation and may be moving it: it is given up (`WorkerGone`)
only if nothing comes within ROUTER_GRACE_S, the routers' own re-issue deadline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOOR_S = 3.0
"""The least silence probed, and the least time between the two probes that prove the worker
gone: the routers' and the workers' own rule for a lease (`orphan_after_s`, 3 lease intervals)."""

CAP_S = 10.0
"""The most silence before a probe, whatever the stream's gaps (a probe of a live worker costs
one small message)."""

GAP_FACTOR = 4.0
"""A stream is silent after this many of its own longest gap between two chunks."""

ROUTER_GRACE_S = 10.0
"""After the proof, how long a live router may still re-issue the stream: its reissue deadline
(services/router/migration.py MigrationConfig.reissue_deadline_s)."""


@dataclass(frozen=True)
class WorkerProbe:
    """Ask the worker's `alive` subject; answer with `on_probe(gone, sent_s)`."""

    worker_id: str
    sent_s: float


@dataclass(frozen=True)
class ResumeDue:
    """The worker was proven gone at `proven_s` and nobody moved the stream: resume it now."""

    worker_id: str
    proven_s: float


@dataclass(frozen=True)
class WorkerGone:
    """The worker was proven gone at `proven_s` and nobody moved the stream since: end it."""

    worker_id: str
    proven_s: float


class StreamWatch:
    def __init__(self, floor_s: float = FLOOR_S, cap_s: float = CAP_S, gap_factor: float = GAP_FACTOR,
                 grace_s: float = ROUTER_GRACE_S):
        self.floor_s, self.cap_s, self.gap_factor, self.grace_s = floor_s, cap_s, gap_factor, grace_s
        self.worker_id = ""
        self.longest_gap_s = 0.0
        self.last_chunk_s: float | None = None
        self.alive_s = -math.inf
        """When the worker was last proven alive: an event, or a probe not refused (its sending)."""
        self.probing_s: float | None = None
        """When the probe now out was sent."""
        self.suspect_s: float | None = None
        """When the probe was sent that first found no responders (a second confirms)."""
        self.gone_s: float | None = None
        """When a second "no responders" proved the worker gone."""
        self.resumed = False
        """Resumed once already: a second proof ends the stream (after the grace)."""

    def bound_s(self) -> float:
        """How long a silence is tolerated before the worker is probed."""
        return min(self.cap_s, max(self.floor_s, self.gap_factor * self.longest_gap_s))

    def on_chunk(self, now: float, worker_id: str = "") -> None:
        if self.last_chunk_s is not None:
            self.longest_gap_s = max(self.longest_gap_s, now - self.last_chunk_s)
        self.last_chunk_s = now
        if worker_id:
            self.worker_id = worker_id
        self.on_event(now)

    def on_event(self, now: float) -> None:
        self.alive_s = max(self.alive_s, now)
        self.suspect_s = self.gone_s = None

    def on_resumed(self, now: float) -> None:
        self.resumed = True
        self.worker_id, self.last_chunk_s, self.probing_s = "", None, None
        self.on_event(now)

    def on_reconnected(self, now: float) -> None:
        """What went unheard while the client was cut off proves nothing: every clock restarts."""
        self.on_event(now)
        self.probing_s = None

    def tick(self, now: float) -> WorkerProbe | ResumeDue | WorkerGone | None:
        if not self.worker_id:  # no worker named yet (queued, or a fleet that does not name it)
            return None
        if self.gone_s is not None and not self.resumed:
            return ResumeDue(self.worker_id, self.gone_s)
        if self.gone_s is not None:
            return WorkerGone(self.worker_id, self.gone_s) if now - self.gone_s >= self.grace_s else None
        if self.probing_s is not None:
            return None
        since = self.alive_s if self.suspect_s is None else max(self.alive_s, self.suspect_s)
        wait = self.bound_s() if self.suspect_s is None else max(self.floor_s, self.bound_s())
        if now - since < wait:
            return None
        self.probing_s = now
        return WorkerProbe(self.worker_id, now)

    def on_probe(self, gone: bool, sent_s: float) -> None:
        if self.probing_s == sent_s:
            self.probing_s = None
        if sent_s < self.alive_s:  # an event came after it went out: its answer says nothing new
            return
        if not gone:
            self.alive_s, self.suspect_s = sent_s, None
        elif self.suspect_s is None:
            self.suspect_s = sent_s
        elif sent_s - self.suspect_s >= self.floor_s and self.gone_s is None:
            self.gone_s = sent_s
