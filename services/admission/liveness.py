"""When admission counts a worker as gone: its silence against the heartbeat interval it
announces and is observed at, measured on admission's own waking time.

    bound_w    = max(MISSED_BEATS · interval_w,  LATE_FACTOR · gap_w)   (the first term is
                 shared.staleness's rule, which the queue and the router apply alone)
    silence_w  = (now − seen_w) − (blind(now) − blind(seen_w))
    fresh      ⇔ silence_w ≤ bound_w

interval_w  the interval the worker announces (Heartbeat.interval_s; 0, a worker that does not
            say: config.HEARTBEAT_INTERVAL_S). MISSED_BEATS = 10: at the default 0.1 s a killed
            fleet is called down after 1 s of silence, as before.
gap_w       the longest gap between two of its heartbeats lately, as received here (a decayed
            maximum: a longer gap raises it at once, then it shrinks by GAP_DECAY per heartbeat).
            A worker whose beats come every 0.4 s on a starved host is late, not gone: it is
            given LATE_FACTOR × its own worst recent gap.
blind(t)    the observer's own time not observing, up to t: every gap between two of its own
            events (any heartbeat, queue state, request or tick) beyond `tick_s`, the most its
            shell promises to leave between two ticks. A stalled event loop (a loaded host, a
            long GC) or a dropped connection hears no heartbeat, and that silence is its own,
            not the workers': after a 1.5 s stall the first request it handles is judged before
            the heartbeats that queued up meanwhile, and would otherwise find every worker
            silent for 1.5 s and call the fleet down (a 503 with nothing queued, seen in CI).
            While its connection is down every moment is blind, whatever it handles meanwhile
            (a request from its own process). `tick_s` None: the caller promises nothing (the
            simulator delivers every event on its virtual time), no blind time is counted.

A worker up when the observer lost the bus is excused on its return (`back`, at back_s):

    silence_w  = (now − back_s) − (blind(now) − blind(back_s)) − E       until its next heartbeat

E the reconnect bound (the shell's natsutil.RECONNECT_BOUND_S, 6.25 s). "Lost" is when it last
heard the bus (a heartbeat, a keep-alive, a queue state): a partition is silent before the
observer's connection knows it. Its own return says nothing of the workers': each reconnects on
its own backoff, up to E through a healed partition (a connect attempt in flight to the silent
address waited out: 5.3 s measured, tests/test_worker_back_late.py), and silence then counted
from the observer's return called a live fleet down after 1 s (503 "No worker is up" to every
request meanwhile, though an admitted request waits in the queue for the worker, stored; round
21). So the first E of its watching after its return is no evidence, as for the router
(services/router/migration.py resubscribe_grace_s): a worker that died in the outage is called
down at back_s + E + bound_w. A worker silent while the observer heard the bus is not excused: it
was down (or within its bound: a real death is then found E later) — a death or a partition of
its own. `overdue_s`: the excuse left of a worker up only by it, which admission counts as wait.

Why not the NATS server's word ("no responders", as the router's lease probe uses): it tells a
closed connection, not a hung worker, and it costs admission a round trip in the path of a
request; the heartbeat already says what admission needs, how fresh the worker's costs are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenyard.shared import staleness
from tokenyard.shared.staleness import MISSED_BEATS

__all__ = ["MISSED_BEATS", "Liveness"]
LATE_FACTOR = 3.0
"""A worker's silence within this many times its own longest recent gap is lateness."""
GAP_DECAY = 0.95
"""Per heartbeat, the remembered longest gap shrinks by this factor (to the latest gap at
least): a stall's gap is forgotten after ~60 regular heartbeats (6 s at 0.1 s)."""


@dataclass
class Beat:
    seen_s: float
    """When its latest heartbeat arrived (the observer's clock), or the observer's return from an
    outage it was up across (`Liveness.back`): its silence counts from there."""
    blind_s: float
    """The observer's blind time total then."""
    interval_s: float
    """The interval it announces."""
    gap_s: float = 0.0
    """Its longest gap between heartbeats lately (decayed maximum)."""
    bound_s: float = 0.0
    """bound_w from the two above, kept at each heartbeat: admission asks `fresh` for every
    worker at every arrival (its passes over the fleet), far more often than beats come."""
    stale_s: float = 0.0
    """shared.staleness's bound for `interval_s` (the first term of bound_w)."""
    excuse_s: float = 0.0
    """Silence not held against it (E): a worker up when the observer lost the bus, from the
    observer's return until its own next heartbeat."""


@dataclass
class Liveness:
    tick_s: float | None = None
    """The most the observer's shell leaves between two of its events (it ticks at least this
    often); None: blind time is not counted."""
    beats: dict[str, Beat] = field(default_factory=dict)
    blind_s: float = 0.0
    """The observer's own time not observing, summed (the module's blind(now))."""
    last_event_s: float | None = None
    first_event_s: float | None = None
    """When the observer handled its first event: how long it has been watching."""
    heard_s: float | None = None
    """When it last heard the bus (a heartbeat, a keep-alive, a queue state)."""
    heard_blind_s: float = 0.0
    """Its blind time total then."""

    def awake(self, now: float, observing: bool = True) -> None:
        """The observer handles an event at `now`: a gap since its previous one beyond tick_s
        was its own blind time. `observing` False: it is cut off from the bus (it handles a
        request from its own process while its connection is down), and the whole time since
        its previous event was blind: before, each such request counted as watching, and after
        a 3 s nats-server outage with HTTP requests every 0.2 s the workers looked silent for
        1.5 s the moment the bus came back (a 503 "No worker is up" in bench chaos)."""
        if self.first_event_s is None:
            self.first_event_s = now
        if self.tick_s is not None and self.last_event_s is not None and now > self.last_event_s:
            gap = now - self.last_event_s
            if not observing:
                self.blind_s += gap
            elif gap > self.tick_s:
                self.blind_s += gap - self.tick_s
        if self.last_event_s is None or now > self.last_event_s:
            self.last_event_s = now

    def heard(self, now: float) -> None:
        """Something arrived on the bus at `now` (after `awake(now)`): it was listening then."""
        self.heard_s, self.heard_blind_s = now, self.blind_s

    def back(self, back_s: float, excuse_s: float) -> None:
        """The observer's connection came back from an outage at `back_s` (before it handles
        anything heard since): every worker up when it last heard the bus, and not heard since
        back_s, is excused `excuse_s` of silence counted from back_s (the module's E)."""
        if self.heard_s is None:
            return
        for b in self.beats.values():
            up = (self.heard_s - b.seen_s) - (self.heard_blind_s - b.blind_s) - b.excuse_s <= b.bound_s
            if up and b.seen_s < back_s:
                b.seen_s, b.blind_s, b.excuse_s = back_s, self.blind_s, excuse_s

    def beat(self, worker_id: str, interval_s: float, now: float) -> None:
        """A heartbeat from `worker_id` arrives at `now` (after `awake(now)`)."""
        self.heard(now)
        interval = staleness.announced_interval_s(interval_s)
        last = self.beats.get(worker_id)
        if last is None:
            stale = staleness.stale_after_s(interval)
            self.beats[worker_id] = Beat(now, self.blind_s, interval, 0.0, max(stale, 0.0), stale)
            return
        self._again(last, interval, now)

    def repeat(self, worker_id: str, now: float) -> bool:
        """`beat` at the interval the worker announced last (a keep-alive repeats its latest
        heartbeat); False for a worker never heard from."""
        last = self.beats.get(worker_id)
        if last is None:
            return False
        self.heard(now)
        self._again(last, last.interval_s, now)
        return True

    def _again(self, last: Beat, interval: float, now: float) -> None:
        gap = self._silence(last, now)  # its own lateness, not the observer's
        # A silence past its bound was an absence (it counted as gone), not lateness: it comes
        # back with a fresh record, or a worker back from a long outage would be kept "up" for
        # LATE_FACTOR × that outage after it died for good.
        last.gap_s = 0.0 if gap > last.bound_s else max(gap, last.gap_s * GAP_DECAY)
        if interval != last.interval_s:
            last.interval_s, last.stale_s = interval, staleness.stale_after_s(interval)
        last.seen_s, last.blind_s, last.excuse_s = now, self.blind_s, 0.0
        last.bound_s = max(last.stale_s, LATE_FACTOR * last.gap_s)

    def _silence(self, b: Beat, now: float) -> float:
        return (now - b.seen_s) - (self.blind_s - b.blind_s) - b.excuse_s

    def bound_s(self, worker_id: str) -> float:
        return self.beats[worker_id].bound_s

    def fresh(self, worker_id: str, now: float) -> bool:
        """Heard from within its bound, net of the observer's blind time; False: never heard."""
        b = self.beats.get(worker_id)
        return b is not None and self._silence(b, now) <= b.bound_s

    def overdue_s(self, worker_id: str, now: float) -> float | None:
        """For a worker fresh only by its excuse (silent past its bound since the observer's
        return): how much of the excuse is left (≥ 0), the longest it may yet take to reconnect;
        None for every other (heard from within its bound, or not excused)."""
        b = self.beats.get(worker_id)
        if b is None or b.excuse_s <= 0.0:
            return None
        silence = self._silence(b, now)  # net of the excuse: what is left of it is −silence
        return max(0.0, -silence) if silence + b.excuse_s > b.bound_s else None

    def reconnecting(self, up: Iterable[str], now: float) -> tuple[int, float]:
        """Of the workers `up` (fresh, healthy): how many are fresh only by their excuse, and the
        least time until one of them may serve — 0 if any was heard within its bound (or none is
        up), else the least excuse left: what admission adds to a request's predicted wait."""
        left = [self.overdue_s(w, now) for w in up]
        overdue = [x for x in left if x is not None]
        return len(overdue), min(overdue) if overdue and len(overdue) == len(left) else 0.0
