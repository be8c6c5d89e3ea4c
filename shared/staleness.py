"""When a worker's heartbeats have stopped: one rule for admission, the queue and the router.

    bound_w = MISSED_BEATS · interval_w        (a worker silent for longer is out)

interval_w  the heartbeat interval the worker announces (Heartbeat.interval_s); a worker that
            does not say (0) beats at config.HEARTBEAT_INTERVAL_S. MISSED_BEATS = 10: at the
            default 0.1 s a worker is out after 1 s of silence; a fleet told to beat every
            0.5 s (`TOKENYARD_HEARTBEAT_S=0.5`) is judged on 5 s, not on one missed beat and a
            half, as the fixed 1 s judged it.

Admission extends the bound for a worker that has been running late (3 × its longest recent
gap) and does not count its own stalls as the workers' silence (services/admission/liveness.py):
it refuses a request outright when no worker is up, so it must not be fooled by a late worker
or a stalled host. The queue and the router only choose among workers; a late one drops out of
their candidates for a moment and is back with its next heartbeat.

`TOKENYARD_STALE_S` (seconds, unset by default) replaces MISSED_BEATS · interval_w for every
worker: a fixed bound for a deployment whose heartbeats are delayed in transit more than their
interval says (a congested link), where the announced interval would call live workers gone.
"""

from __future__ import annotations

import os

from tokenyard.shared import config

MISSED_BEATS = 10
"""Announced heartbeat intervals of silence after which a worker counts as gone."""

STALE_OVERRIDE_S: float | None = float(os.environ["TOKENYARD_STALE_S"]) if os.environ.get("TOKENYARD_STALE_S") else None
"""TOKENYARD_STALE_S: a fixed bound instead of the derived one (module doc); None: derived."""


def announced_interval_s(interval_s: float) -> float:
    """The interval a worker beats at: what it announces, or the default where it says nothing."""
    return interval_s if interval_s > 0 else config.HEARTBEAT_INTERVAL_S


def stale_after_s(interval_s: float) -> float:
    """bound_w for a worker announcing `interval_s` (0: not said)."""
    if STALE_OVERRIDE_S is not None:
        return STALE_OVERRIDE_S
    return MISSED_BEATS * announced_interval_s(interval_s)
