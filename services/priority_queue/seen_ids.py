"""The request ids a queue had within JetStream's duplicate window, for `take`'s duplicate check
(services/priority_queue/shell.py): a reused id is not taken, so the JetStream copy alone decides
and its duplicate check answers. Ids are kept in arrival order and forgotten once older than the
window, or past REMEMBERED of them (a reused id is then the worker's to answer)."""

from __future__ import annotations

from collections import OrderedDict

from tokenyard.shared import natsutil

REMEMBERED = 50_000
"""Request ids a queue remembers (as many as a router or a worker remembers)."""


class SeenIds:
    def __init__(self, window_s: float = natsutil.QUEUE_DUPLICATE_WINDOW_S, remembered: int = REMEMBERED):
        self.window_s = window_s
        self.remembered = remembered
        self._when: OrderedDict[str, float] = OrderedDict()
        """request id → when this queue first had it."""

    def check(self, request_id: str, now: float) -> bool:
        """Whether `request_id` was seen within the window; notes it (at `now`) if not."""
        when = self._when
        while when and (len(when) >= self.remembered or next(iter(when.values())) < now - self.window_s):
            when.popitem(last=False)
        if request_id in when:
            return True
        when[request_id] = now
        return False

    def __len__(self) -> int:
        return len(self._when)
