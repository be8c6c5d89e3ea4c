"""The router's view of the fleet: one row per worker, each field a numpy array, so a
scorer computes over all instances at once (no per-instance Python loop on the hot path).

Rows are set from heartbeats and corrected optimistically at each decision:
    routed to i  ⇒  waiting[i] += 1, queued_prefill[i] += new tokens of the request
so requests between two heartbeats do not herd onto one instance; the next heartbeat
overwrites the guess with the truth. Rows of workers silent for `forget_after_s` are
dropped (bounded memory); a row is a candidate only while fresh (`stale_after_s`).
"""

from __future__ import annotations

import numpy as np

from shared.schemas import Heartbeat, Phase

PHASES = {Phase.MIXED: 0, Phase.PREFILL: 1, Phase.DECODE: 2}


class FleetView:
    _FLOAT = ("queued_prefill", "seen_s", "step_ms")
    _INT = ("running", "waiting", "kv_used", "kv_free", "last_chosen", "model")
    _BOOL = ("healthy", "accepting")

    def __init__(self, capacity: int = 16):
        self.n = 0
        self.ids: list[str] = []
        self.slot: dict[str, int] = {}
        self.macro: list[str] = []
        self.model_codes: dict[str, int] = {}
        """model name → the code stored in the `model` column."""
        self._alloc(capacity)
        self.decisions = 0

    def _alloc(self, capacity: int) -> None:
        old = {name: getattr(self, name, None) for name in (*self._FLOAT, *self._INT, *self._BOOL, "phase")}
        for names, dtype in ((self._FLOAT, np.float64), (self._INT, np.int64), (self._BOOL, np.bool_)):
            for name in names:
                setattr(self, name, np.zeros(capacity, dtype=dtype))
        self.phase = np.zeros(capacity, dtype=np.int8)
        self.last_chosen[:] = -1
        for name, arr in old.items():
            if arr is not None:
                getattr(self, name)[: self.n] = arr[: self.n]

    def upsert(self, hb: Heartbeat, now: float) -> int:
        i = self.slot.get(hb.worker_id)
        if i is None:
            if self.n == len(self.running):
                self._alloc(max(1, 2 * self.n))
            i = self.n
            self.n += 1
            self.ids.append(hb.worker_id)
            self.macro.append(hb.macro_id)
            self.slot[hb.worker_id] = i
            self.last_chosen[i] = -1
            self.accepting[i] = True
        self.model[i] = self.model_codes.setdefault(hb.model, len(self.model_codes))
        self.queued_prefill[i] = hb.queued_prefill_tokens
        self.running[i] = hb.running
        self.waiting[i] = hb.waiting
        self.kv_used[i] = hb.kv_blocks_used
        self.kv_free[i] = hb.kv_blocks_free
        self.step_ms[i] = hb.step_time_ms
        self.healthy[i] = hb.healthy and not hb.draining
        self.phase[i] = PHASES.get(hb.phase, 0)
        self.seen_s[i] = now
        self.macro[i] = hb.macro_id
        return i

    def set_accepting(self, worker_id: str, accepting: bool) -> None:
        i = self.slot.get(worker_id)
        if i is not None:
            self.accepting[i] = accepting

    def note_routed(self, i: int, new_tokens: int) -> None:
        self.waiting[i] += 1
        self.queued_prefill[i] += new_tokens
        self.last_chosen[i] = self.decisions
        self.decisions += 1

    def fresh(self, now: float, stale_after_s: float) -> np.ndarray:
        return (now - self.seen_s[: self.n]) <= stale_after_s

    def forget_silent(self, now: float, forget_after_s: float) -> list[str]:
        """Drop rows of workers silent for longer than `forget_after_s` (swap-remove)."""
        gone = [self.ids[i] for i in range(self.n) if now - self.seen_s[i] > forget_after_s]
        for wid in gone:
            i, last = self.slot.pop(wid), self.n - 1
            if i != last:
                for name in (*self._FLOAT, *self._INT, *self._BOOL, "phase"):
                    arr = getattr(self, name)
                    arr[i] = arr[last]
                self.ids[i], self.macro[i] = self.ids[last], self.macro[last]
                self.slot[self.ids[i]] = i
            self.ids.pop()
            self.macro.pop()
            self.n -= 1
        return gone
