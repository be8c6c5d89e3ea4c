"""Which of the queue's states go out on `llm.v1.pq.state`: one that differs from the last sent
(its timestamp aside) at once; an unchanged one (an idle queue's) only every UNCHANGED_STATS_S,
so an idle fleet's readers hear a third of the messages and still never take the queue for gone."""

from __future__ import annotations

import math

import msgspec
from tokenyard.shared import schemas

UNCHANGED_STATS_S = 0.3
"""An unchanged QueueStats is published this often, not every stats interval: well within
peer_watch.PEER_SILENT_S and the readers' staleness (admission's config.STALE_AFTER_S, 1 s; macro's 3 s),
so a live idle queue is never taken for gone, at a third of the messages."""


class StatsGate:
    """Whether a QueueStats goes out: one that differs from the last sent (its `ts` aside) at
    once, the same one again only UNCHANGED_STATS_S after the last."""

    def __init__(self) -> None:
        self.last: schemas.QueueStats | None = None
        self.sent_s = -math.inf

    def due(self, stats: schemas.QueueStats, now: float) -> bool:
        same = msgspec.structs.replace(stats, ts=0.0)
        if same == self.last and now - self.sent_s < UNCHANGED_STATS_S:
            return False
        self.last, self.sent_s = same, now
        return True
