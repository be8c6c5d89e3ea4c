"""Whether a stored copy that another queue replica took is left to it (the queue shell's
`_on_pulled`): admission in a replica's process hands it a request and stores the request's
copy marked with that replica (`Tokenyard-Taken-By`); another replica that gets the copy hands it
back to JetStream while the taker lives, and places it only once the taker is gone: not heard for
PEER_SILENT_S, where "heard" is its last QueueStats on `llm.v1.pq.state` (every 100 ms, or every
state_gate.UNCHANGED_STATS_S while unchanged) or, for a taker never heard yet, the first of its
copies to come here. A silence this replica could not hear counts for nothing: the clock starts no
earlier than this replica's own connection's last return from an outage.

Why each rule: a replica that has just started has heard no peer yet (the first copy starts the
clock, so it does not place every copy a live peer took); a replica started a second ago has not
yet been heard by the others (chaos seed 12: a restarted front took a submit in its first 100 ms,
and the standby, which had never heard of it, placed its copy too); and a nats-server outage of
more than PEER_SILENT_S made every peer look gone at once (chaos seed 11: three requests run
twice). A taker that died before it was ever heard costs its copies PEER_SILENT_S more."""

from __future__ import annotations

PEER_SILENT_S = 1.0
"""A replica not heard (above) for this long is gone: the requests it took from admission in its
process are anyone's."""
TAKEN_RETRY_S = 0.5
"""A request another live replica took is handed back to JetStream for this long."""


def leave_to_taker(taker: str | None, me: str, heard_s: float, back_s: float | None, now: float) -> bool:
    """True: the copy is a live replica's (`taker`, last heard at `heard_s`), to be handed back.
    `back_s`: when this replica's connection last came back from an outage (None: never)."""
    if not taker or taker == me:
        return False
    return now - max(heard_s, back_s or 0.0) < PEER_SILENT_S


class PeerWatch:
    """The other queue replicas as one replica knows them (`me`): when each was last heard."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.heard: dict[str, float] = {}
        """Replicas heard on `llm.v1.pq.state` → when last."""
        self._first_copy: dict[str, float] = {}
        """Takers never heard there → when the first of their copies came."""

    def on_state(self, instance_id: str, now: float) -> None:
        if instance_id != self.me:
            self.heard[instance_id] = now

    def leave_to_taker(self, taker: str | None, back_s: float | None, now: float) -> bool:
        """Whether a copy taken by `taker` is handed back (module docstring)."""
        if not taker or taker == self.me:
            return False
        heard = self.heard.get(taker)
        if heard is None:
            heard = self._first_copy.setdefault(taker, now)
        return leave_to_taker(taker, self.me, heard, back_s, now)
