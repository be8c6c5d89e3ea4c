"""KeepsTurn: a put-back request is served next, whatever the policy's internal state.

The queue pops a request, the router finds no capacity, the queue pushes it back: it had
its turn and must not lose it (round-robin cursors, DRR deficits, WFQ virtual time have all
moved on since). The wrapper remembers the pop order of the last `memory` requests it
handed out; pushing one of them again puts it in a return lane, ordered by that pop order,
which every pop drains first. Everything else goes to the wrapped policy.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from tokenyard.services.priority_queue.policies.base import QueuePolicy, klass
from tokenyard.shared.schemas import AdmittedRequest


class KeepsTurn:
    def __init__(self, inner: QueuePolicy, memory: int = 65536) -> None:
        self.inner = inner
        self.name = inner.name
        self.memory = memory
        self._seq = 0
        self._popped: OrderedDict[str, int] = OrderedDict()
        self._lane: list[tuple[int, str]] = []
        self._back: dict[str, AdmittedRequest] = {}

    def push(self, req: AdmittedRequest, now: float) -> None:
        rid = req.request_id
        if rid in self._back or rid in self.inner:
            return
        seq = self._popped.pop(rid, None)
        if seq is None:
            self.inner.push(req, now)
        else:
            self._back[rid] = req
            heapq.heappush(self._lane, (seq, rid))

    def _from_lane(self, only_p0: bool) -> AdmittedRequest | None:
        while self._lane:
            seq, rid = self._lane[0]
            req = self._back.get(rid)
            if req is None:
                heapq.heappop(self._lane)
                continue
            if only_p0 and klass(req) != 0:
                return None
            heapq.heappop(self._lane)
            del self._back[rid]
            self._remember(rid, seq)
            return req
        return None

    def _remember(self, rid: str, seq: int) -> None:
        self._popped[rid] = seq
        if len(self._popped) > self.memory:
            self._popped.popitem(last=False)

    def pop(self, now: float) -> AdmittedRequest | None:
        req = self._from_lane(False)
        if req is None:
            req = self.inner.pop(now)
            if req is not None:
                self._seq += 1
                self._remember(req.request_id, self._seq)
        return req

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        req = self._from_lane(True)
        if req is None:
            pop = getattr(self.inner, "pop_realtime", None)
            req = pop(now) if pop is not None else None
            if req is not None:
                self._seq += 1
                self._remember(req.request_id, self._seq)
        return req

    def remove(self, request_id: str) -> AdmittedRequest | None:
        req = self._back.pop(request_id, None)
        return req if req is not None else self.inner.remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._back or request_id in self.inner

    def __len__(self) -> int:
        return len(self._back) + len(self.inner)
