"""Whether a stored copy that another queue replica took is left to it (the queue shell's
`_on_pulled`): admission in a replica's process hands it a request and stores the request's
copy marked with that replica (`Tokenyard-Taken-By`); another replica that gets the copy hands it
back to JetStream while the taker lives, and places it only once the taker is gone (silent on
`llm.v1.pq.state` for PEER_SILENT_S). A silence this replica could not hear counts for nothing:
the taker's clock starts no earlier than this replica's own start (it has heard no peer yet) and
its own connection's last return from an outage. Before the second rule, a nats-server outage of
more than PEER_SILENT_S made every peer look gone at once, and each replica placed the copies
its peers had taken and placed already (bench.faults chaos seed 11: three requests run twice)."""

from __future__ import annotations

PEER_SILENT_S = 1.0
"""A replica not heard on `llm.v1.pq.state` (it publishes every 100 ms, or every
state_gate.UNCHANGED_STATS_S while its state does not change) for this long is gone: the requests it took
from admission in its process are anyone's."""
TAKEN_RETRY_S = 0.5
"""A request another live replica took is handed back to JetStream for this long."""


def leave_to_taker(taker: str | None, me: str, heard_s: float | None, started_s: float,
                   back_s: float | None, now: float) -> bool:
    """True: the copy is a live replica's (`taker`, last heard at `heard_s`; None: never), to be
    handed back. `started_s`: when this replica started; `back_s`: when its connection last came
    back from an outage (None: never)."""
    if not taker or taker == me:
        return False
    since = max(started_s if heard_s is None else heard_s, back_s or 0.0)
    return now - since < PEER_SILENT_S
