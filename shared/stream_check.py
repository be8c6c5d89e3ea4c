"""The receiving end of one stream, pure: the order and completeness a client's stream
guarantees (shared/client.py) — `accepted` first, repeated seqs dropped, what comes after a gap
held until the gap fills, and a gap open for GAP_WAIT_S turned into an error.
"""

from __future__ import annotations

from tokenyard.shared import schemas

GAP_WAIT_S = 15.0
"""How long chunks after a gap wait for the missing ones before the stream fails. A worker
replays 2 s after it reconnects, but a replay of ~12k events per worker on a loaded 2-core
machine ended 4.3 s after the restart and its reader lagged further (bench.faults
nats-restart: 12 of 20 streams failed a 6 s wait though the fill was on its way), so the
wait is generous: a gap that will never fill costs a quarter of the idle watchdog, a gap
that would have filled costs the whole request."""


class StreamCheck:
    """The receiving end of one stream, pure: orders `accepted` first (a first chunk that
    carries it counts; a later copy is dropped), drops repeated seqs,
    holds what comes after a gap until the gap fills, and turns a gap that stays open for
    GAP_WAIT_S into an error.

        check.on_event(event, now) → the events to hand on now (possibly none)
        check.expired(now)         → the error once a gap waited too long, else None
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.next_seq = 0
        self.accepted = False
        self.held: list[schemas.StreamEvent] = []
        self.ahead: dict[int, schemas.Chunk] = {}
        """Chunks past a gap, by seq, waiting for the missing ones."""
        self.ahead_end: schemas.StreamEvent | None = None
        """A terminal event that came while a gap was open."""
        self.gap_since: float | None = None
        self.done = False

    def expired(self, now: float) -> schemas.Error | None:
        if self.done or self.gap_since is None or now - self.gap_since < GAP_WAIT_S:
            return None
        got = min(self.ahead) if self.ahead else getattr(self.ahead_end, "seq", self.next_seq)
        return self._gap(self.next_seq, got)

    def on_event(self, event: schemas.StreamEvent, now: float = 0.0) -> list[schemas.StreamEvent]:
        if type(event) is schemas.Chunk and event.seq == self.next_seq and self.accepted and not self.ahead \
                and self.ahead_end is None and not self.done:
            self.next_seq += 1  # the common case, every token of a healthy stream: in order, nothing held
            return [event]
        self._now = now
        if self.done:
            return []
        if type(event) is schemas.Accepted and self.accepted:
            return []  # the first chunk brought the acceptance already (or a repeat)
        if not self.accepted and type(event) is schemas.Chunk and event.accepted is not None:
            return self._release_held(event.accepted, event)  # the first chunk stands for `accepted`
        if isinstance(event, schemas.Accepted | schemas.Rejected) or (
            isinstance(event, schemas.Error) and not self.accepted
        ):
            return self._release_held(event)
        if not self.accepted:
            self.held.append(event)
            return []
        return self._check(event)

    def _release_held(self, first: schemas.StreamEvent, chunk: schemas.Chunk | None = None) -> list[schemas.StreamEvent]:
        """The stream is accepted (or refused): `first`, then what waited for it, in order."""
        self.accepted = True
        held, self.held = self.held, []
        out: list[schemas.StreamEvent] = [first]
        for e in held if chunk is None else [chunk, *held]:
            out.extend(self._check(e))
        return out

    def _check(self, event: schemas.StreamEvent) -> list[schemas.StreamEvent]:
        if self.done:
            return []
        if isinstance(event, schemas.Chunk):
            if event.seq < self.next_seq or event.seq in self.ahead:
                return []  # a repeat (a migration or a replay resent it)
            if event.seq > self.next_seq:
                self._hold(event)
                return []
            self.next_seq += 1
            return [event, *self._release()]
        if isinstance(event, schemas.Finished) and event.seq != self.next_seq and event.finish_reason != "abort":
            if event.seq < self.next_seq:  # it counts fewer chunks than came: not this stream's end
                return [self._gap(self.next_seq, event.seq)]
            self.ahead_end = event
            self._hold(None)
            return []
        if isinstance(event, schemas.TERMINAL_EVENTS):
            self.done = True
        return [event]

    def _hold(self, chunk: schemas.Chunk | None) -> None:
        if chunk is not None:
            self.ahead[chunk.seq] = chunk
        if self.gap_since is None:
            self.gap_since = self._now

    def _release(self) -> list[schemas.StreamEvent]:
        """The chunks (and the end) a filled gap lets through."""
        out: list[schemas.StreamEvent] = []
        while self.next_seq in self.ahead:
            out.append(self.ahead.pop(self.next_seq))
            self.next_seq += 1
        if self.ahead or (self.ahead_end is not None and self.ahead_end.seq > self.next_seq):
            return out  # another gap further on: keep its clock running
        self.gap_since = None
        if self.ahead_end is not None:
            out.extend(self._check(self.ahead_end))
            self.ahead_end = None
        return out

    def _gap(self, want: int, got: int) -> schemas.Error:
        self.done = True
        return schemas.Error(self.request_id, 502, f"stream lost chunks: expected seq {want}, got {got}", seq=want)
