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

Why not the NATS server's word ("no responders", as the router's lease probe uses): it tells a
closed connection, not a hung worker, and it costs admission a round trip in the path of a
request; the heartbeat already says what admission needs, how fresh the worker's costs are.
"""

from __future__ import annotations

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
    """When its latest heartbeat arrived (the observer's clock)."""
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

    def beat(self, worker_id: str, interval_s: float, now: float) -> None:
        """A heartbeat from `worker_id` arrives at `now` (after `awake(now)`)."""
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
        last.seen_s, last.blind_s = now, self.blind_s
        last.bound_s = max(last.stale_s, LATE_FACTOR * last.gap_s)

    def _silence(self, b: Beat, now: float) -> float:
        return (now - b.seen_s) - (self.blind_s - b.blind_s)

    def bound_s(self, worker_id: str) -> float:
        return self.beats[worker_id].bound_s

    def fresh(self, worker_id: str, now: float) -> bool:
        """Heard from within its bound, net of the observer's blind time; False: never heard."""
        b = self.beats.get(worker_id)
        return b is not None and (now - b.seen_s) - (self.blind_s - b.blind_s) <= b.bound_s
