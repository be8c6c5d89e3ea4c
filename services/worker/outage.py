"""What a worker sends around a NATS outage, pure: which stream events to publish at once,
which to hold back, and what to send again once the clients are back.

nats-py buffers what a service publishes while disconnected and sends it on reconnect,
usually before the clients have resubscribed their inboxes; and what went into the socket
just before the disconnect was noticed may never have reached the server. So:

    steady (connected, no replay pending)   publish; remember the last `before_s` of events
    unsure (disconnected, or a reconnect    publish chunks at once (a client already back
            seen and its replay not done)   reads them) and keep every event for the replay;
                                            HOLD terminal events (finished / error)
    reconnect seen (count went up)          replay = the remembered `before_s` + what was kept;
                                            due `after_s` later (the clients' time to resubscribe)
    replay due                              the shell drains `take()` batch by batch until it
                                            comes back empty, which ends the unsure period

Invariant (tests/test_worker_outage.py, hypothesis): in the order the shell publishes, no
event of a stream follows that stream's terminal event. A reader that stops at `finished`
therefore has every seq `finished` covers, once the replay reached it (seqs it already had
come again; receivers drop them). Chunks past `max_events` are not kept (a client then sees
a gap and ends the stream with an error); terminal events are always kept.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

REPLAY_AFTER_S = 2.0
"""After a reconnect: how long clients get to resubscribe before the replay."""
REPLAY_BEFORE_S = 5.0
"""How far back before a disconnect the replay reaches. What the server had taken but not yet
written to a slow receiver (an edge or client busy on a loaded machine reads seconds behind)
dies with it: with 1 s, 10 of 20 TokenyardClient streams and 10 of 20 edge streams lost
chunks from before that window (a 502 each, bench.faults nats-restart)."""
REPLAY_MAX_EVENTS = 200_000

Event = tuple[str, bytes, dict[str, str] | None]
"""A stream event as published: subject, payload, NATS headers."""


@dataclass
class OutageReplay:
    after_s: float = REPLAY_AFTER_S
    before_s: float = REPLAY_BEFORE_S
    max_events: int = REPLAY_MAX_EVENTS
    reconnects: int = 0
    """The connection's reconnect count last seen."""
    due_at: float | None = None
    """When the pending replay may go out; None: steady."""
    _kept: list[Event] = field(default_factory=list)
    _recent: deque[tuple[float, Event]] = field(default_factory=deque)

    @property
    def pending(self) -> bool:
        return self.due_at is not None

    def observe(self, now: float, reconnects: int) -> bool:
        """The connection's reconnect count; True when it went up (a replay is now due at
        `due_at`, pushed back if one was already pending)."""
        if reconnects == self.reconnects:
            return False
        self.reconnects = reconnects
        self.due_at = now + self.after_s
        self._kept[:0] = [event for _, event in self._recent]
        self._recent.clear()
        return True

    def send(self, now: float, connected: bool, event: Event, terminal: bool) -> bool:
        """Record one stream event; True: publish it now, False: it waits for the replay."""
        if connected and not self.pending:
            recent = self._recent
            recent.append((now, event))
            while recent[0][0] < now - self.before_s:
                recent.popleft()
            return True
        if terminal or len(self._kept) < self.max_events:
            self._kept.append(event)
        return not terminal

    def take(self, now: float, connected: bool) -> list[Event]:
        """The next batch of the due replay, in the order the events were sent. An empty batch
        while connected ends the unsure period: events sent while a batch was being published
        come in the next batch, so a held terminal event never overtakes its stream's chunks.
        While disconnected the batch is empty and the replay stays pending (the next reconnect
        makes it due again). A batch counts as sent at `now`: a disconnect soon after replays
        it again, as it would any event of the last `before_s`."""
        if not connected:
            return []
        batch, self._kept = self._kept, []
        if not batch:
            self.due_at = None
        self._recent.extend((now, event) for event in batch)
        return batch
