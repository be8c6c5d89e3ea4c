"""The worker follows the leases of the requests it runs, pure: a request whose client is gone
stops here whoever placed it (the router that placed it may have died with the client: the
in-queue edge, `tokenyard up`'s default layout, holds the edge, admission and a router in one
process, and a SIGKILL takes all three).

    tick(now, running)             running: lease → its `…<lease>.alive` subject, for every lease
                                   with a request running or waiting here → [LeaseProbe]
    on_answer(lease, gone, sent_s) the probe sent at `sent_s`: "no responders" (gone) or not
    on_reconnected(now)            this worker's own connection came back

A lease is first seen when the tick finds a request of it running here: its clock starts then
(a request younger than `after_s` costs no probe). A lease not proven alive for `after_s` is
probed once on its holder's `alive` subject (one probe per lease, however many requests it has
here, and no second while one is out). Only "no responders" twice, on probes at least `after_s`
apart with no other answer between, proves the holder's connection gone (one alone may be a
client's or router's brief reconnect, which a router's own rule — silent 3 s, then no responders
— tolerates too; acting on one would abort a live client's work or have a live router's requests
adopted, and then run twice after a migration): the shell then aborts every request of the lease
here (free the KV, no more chunks). Any other
outcome, an answer or a timeout, proves it alive-or-late as of the probe's sending: a CPU-starved
client whose loop stalls must not lose its work (services/router/migration.py, the routers'
same rule). A lease with no request left here is forgotten.

After this worker's own reconnect the clients may not have resubscribed yet, so every clock
restarts then, and an answer to a probe sent before it is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

LEASE_INTERVAL_S = 1.0
"""How often a lease holder renews it (shared/client.py)."""

ORPHAN_AFTER_S = 3 * LEASE_INTERVAL_S
"""How long a lease goes unproven before it is probed: the routers' `orphan_after_s`."""


@dataclass(frozen=True)
class LeaseProbe:
    """Ask `subject` whether anyone listens (the shell's LEASE_PROBE_TIMEOUT_S); then `on_answer`.
    `lease`: the key (a lease, or a router's `alive` subject)."""

    lease: str
    subject: str
    sent_s: float


class LeaseWatch:
    def __init__(self, after_s: float = ORPHAN_AFTER_S, at_once: bool = False):
        """`at_once`: a newly seen lease is probed at the next tick, not `after_s` later (the
        worker's ask to an adopter whose reply was lost: its answer is wanted now)."""
        self.after_s = after_s
        self.at_once = at_once
        self.proven: dict[str, float] = {}
        """lease → when its holder was last proven alive (or first seen here)."""
        self.probing: dict[str, float] = {}
        """lease → when the probe now out was sent."""
        self.suspect: dict[str, float] = {}
        """lease → when the probe was sent that first found no responders (a second one confirms)."""
        self.reconnected_s = -1e18
        self.probes = 0
        """Probes sent (a metric)."""

    def tick(self, now: float, running: dict[str, str]) -> list[LeaseProbe]:
        for lease in [k for k in self.proven if k not in running]:
            del self.proven[lease]
            self.probing.pop(lease, None)
            self.suspect.pop(lease, None)
        out = []
        for lease in sorted(running):
            since = self.proven.setdefault(lease, now - self.after_s if self.at_once else now)
            if lease not in self.probing and now - since >= self.after_s:
                self.probing[lease] = now
                self.probes += 1
                out.append(LeaseProbe(lease, running[lease], now))
        return out

    def on_answer(self, lease: str, gone: bool, sent_s: float) -> bool:
        """True: the lease's holder is gone, abort its requests here."""
        if self.probing.get(lease) == sent_s:
            del self.probing[lease]
        if lease not in self.proven or sent_s < self.reconnected_s:
            return False
        if gone:
            first = self.suspect.setdefault(lease, sent_s)
            if sent_s - first >= self.after_s:  # confirmed by a later probe
                del self.proven[lease], self.suspect[lease]
                return True
            self.proven[lease] = max(self.proven[lease], sent_s)  # probed again after_s later
            return False
        self.suspect.pop(lease, None)
        self.proven[lease] = max(self.proven[lease], sent_s)
        return False

    def on_reconnected(self, now: float) -> None:
        self.reconnected_s = now
        self.proven = {k: max(v, now) for k, v in self.proven.items()}
        self.probing.clear()
        self.suspect.clear()
