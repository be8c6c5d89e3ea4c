"""Bubble placement (`--queue-policy bubble-placed`): seed 004's length queues each served by
instances of their own, the split re-derived from what the queue sees, idle instances lent to
shorter ranges.

Measured (docs/results-bubble.md, round 5): in a short flood it serves short requests 2-3 ×
faster than the same bubble queues over the shared fleet, and its long requests' p99 is
1.3-2 × theirs; without a flood it adds a third to the long p99. So it is a named choice, not
the default `bubble`.

Why. Over one shared fleet a queue order only decides *when* a request leaves: under flow
control every release takes room anywhere in the fleet, so in a short-request flood a short
request waits while the longer partitions take their turns, and the round gives long
requests only their turn's share (docs/results-bubble.md). In the seed every queue is served
by capacity of its own (§6 lists lending an idle queue's capacity as the next step), and
its fixed-partition baseline splits the instances once. Here the partitions own instances
and the split follows the demand, so each range is released into its own instances' room:
shorts never wait for a long request's turn, nor sit in an engine behind its prefill chunks.

Groups. The base ranges R_k of the bubble queues ([0,512) [512,2k) [2k,8k) [8k,∞) on
L = prompt + max_tokens, the length they partition on); per range, the work the fleet must
serve, in L tokens per second:

    d_k = a_k + q_k / T
    a_k = Σ L of range k's arrivals, decayed with half-life T, ÷ (T / ln 2)   (a rate)
    q_k = Σ L of range k's parked requests (held for want of room: the backlog)
    T   = HALF_LIFE_S: the horizon over which the rate is measured and a backlog should clear

Shares x_k = N · d_k / Σ d over the N fresh instances that take new requests. Adjacent ranges
merge, shortest first, until each group has x ≥ MERGE = 1/2 (the seed merges adjacent queues
both under 50 % load; a remainder under it at the long end joins the group before it), and
while there are more groups than instances, the adjacent pair with the least share. A group
gets n_g instances by largest remainder of its x_g (ties: the longer group), at least one
(taken from the largest). The split stands while every |n_g − x_g| < 1 (any rounding of the
shares is kept: no flapping at a boundary). When it
changes, a worker stays with the group that now holds its old group's first range; a
group over its count gives up its most-backlogged workers where only longer groups are short
of workers, else its least-backlogged (a worker moving to a shorter range should bring the
least unprefilled work: its new short requests wait behind it), and the groups short of
workers take them least-backlogged first, shortest group first (ties: worker id).

Release (QueueCore's flow control, per group instead of over the fleet):

    room_g = Σ_{w ∈ g} max(0, room_w) − Σ size(r) over the requests in flight charged to g

  1. parked requests, each group in (class, pop order), while room_g > 0 — the class a parked
     request has aged into by now (the wrapped scheduler's aging rule, `ages_to`), so a low
     class parked behind a stream of parked higher ones climbs as it would have in the queue;
  2. the wrapped policy's pops (its order: the bubble queues'), each released into its group
     while room_g > 0, else parked there — until it is empty or no group has room;
  3. a group with nothing parked lends its room to shorter groups that have parked requests
     (shortest first): such a request may go to its own workers or to the lender's. Never to
     a longer group: a long prompt on a short range's instance would hold its shorts behind
     seconds of prefill chunks, the interference the split is there to remove.

A released request carries the workers it may go to (QueueCore.placed_on); the router keeps
to them (services.router.core.Placement's `only`). With no demand seen yet, one group holds
every instance (the shared fleet). P0's reserve (QueueCore) is released to any worker.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence

from tokenyard.services.priority_queue.policies.base import (
    NUM_CLASSES,
    Promotions,
    QueuePolicy,
    WorkerRoom,
    aged_class,
    cost,
    klass,
)
from tokenyard.services.priority_queue.policies.bubble import BASE_BOUNDS
from tokenyard.services.priority_queue.policies.bubble_partitions import range_of
from tokenyard.shared.schemas import AdmittedRequest

HALF_LIFE_S = 10.0
"""T: the arrival rate's half-life, and the time a range's backlog is given to clear (a split
that follows bursts of a few heartbeats would move instances mid-prefill)."""
MERGE = 0.5
"""A range whose share would not load half an instance shares one with its neighbour (the
seed merges adjacent queues both under 50 % load)."""
MEMORY = 65536
"""Request ids remembered as counted (demand) — a put-back is not a new arrival."""


def merge_groups(shares: Sequence[float], instances: int) -> list[tuple[int, int, float]]:
    """Adjacent ranges merged shortest first until each group's share is ≥ MERGE (a remainder
    under it at the long end joins the group before it), then the adjacent pair with the
    smallest share while there are more groups than instances: (first range, last range,
    share) per group."""
    groups: list[tuple[int, int, float]] = []
    start, acc = 0, 0.0
    for k, x in enumerate(shares):
        acc += x
        if acc >= MERGE:
            groups.append((start, k, acc))
            start, acc = k + 1, 0.0
    if start < len(shares):
        if groups:
            first, _, x = groups.pop()
            groups.append((first, len(shares) - 1, x + acc))
        else:
            groups.append((0, len(shares) - 1, acc))
    while len(groups) > max(1, instances):
        i = min(range(len(groups) - 1), key=lambda j: (groups[j][2] + groups[j + 1][2], j))
        a, b = groups[i], groups[i + 1]
        groups[i : i + 2] = [(a[0], b[1], a[2] + b[2])]
    return groups


def split_counts(shares: Sequence[float], total: int) -> list[int]:
    """Instances per group summing to `total` (≥ the number of groups): largest remainder of
    the shares (ties: the later group), then each empty group one from the largest."""
    counts = [int(x) for x in shares]
    left = total - sum(counts)
    order = sorted(range(len(shares)), key=lambda g: (-(shares[g] - counts[g]), -g))
    for g in order[:max(0, left)]:
        counts[g] += 1
    for g in range(len(counts)):
        if counts[g] == 0:
            donor = max(range(len(counts)), key=lambda j: (counts[j], j))
            counts[donor] -= 1
            counts[g] = 1
    assert sum(counts) == total and min(counts) >= 1
    return counts


class BubblePlacement:
    """A queue policy (the wrapped one's order) whose releases are placed by length group."""

    def __init__(self, inner: QueuePolicy, bounds: Sequence[float] = BASE_BOUNDS,
                 half_life_s: float = HALF_LIFE_S, ages_to: Promotions | None = None) -> None:
        self.inner = inner
        self.ages_to: Promotions = ages_to or [(c, math.inf) for c in range(NUM_CLASSES)]
        """The wrapped scheduler's aging rule (ClassScheduler.ages_to), applied to parked
        requests too; None: no aging."""
        self.name = inner.name
        self.bounds = tuple(bounds)
        self.ranges = len(self.bounds) - 1
        self.half_life_s = half_life_s
        self.arrived = [0.0] * self.ranges
        """a_k · (T / ln 2): Σ L of range k's arrivals, decayed to `arrived_at`."""
        self.arrived_at = 0.0
        self.groups: list[tuple[int, int]] = [(0, self.ranges - 1)]
        """(first range, last range) per group, shortest first."""
        self.owner: dict[str, int] = {}
        """worker id → its group's index in `groups`."""
        self.parked: list[list[tuple[int, int, str]]] = [[] for _ in range(self.ranges)]
        """Per range: (class, pop order, id) heaps of parked requests (lazy deletion)."""
        self.where: dict[str, tuple[int, int, AdmittedRequest, int]] = {}
        """Parked request id → (range, pop order, request, the class it has aged into)."""
        self.aging: list[tuple[float, int, str]] = []
        """(next promotion time, pop order, id) of parked requests (lazy deletion)."""
        self.parked_work = [0] * self.ranges
        self.charged: dict[str, tuple[int, int]] = {}
        """Released request id → (the group whose room it took, its pop order)."""
        self.seq = 0
        self._counted: OrderedDict[str, None] = OrderedDict()
        self.splits = 0
        """How many times the split changed (a metric of churn)."""

    # ── queue policy port (an ungated pop: parked requests first, then the wrapped policy) ──
    def push(self, req: AdmittedRequest, now: float) -> None:
        rid = req.request_id
        if rid in self.where or rid in self.inner:
            return
        back = self.charged.pop(rid, None)
        if back is not None:  # released, not placed: it had its turn, so it heads its range
            self._park(req, back[1], now)
            return
        if rid not in self._counted:
            self._counted[rid] = None
            if len(self._counted) > MEMORY:
                self._counted.popitem(last=False)
            self._decay(now)
            self.arrived[self.range_of(req)] += cost(req)
        self.inner.push(req, now)

    def pop(self, now: float) -> AdmittedRequest | None:
        self.age_until(now)
        best = min(self._heads(range(self.ranges)), default=None)
        if best is not None:
            return self._unpark(best[2])
        return self.inner.pop(now)

    def pop_realtime(self, now: float) -> AdmittedRequest | None:
        self.age_until(now)
        for k in range(self.ranges):
            for cls, _, rid in self._heads([k]):
                if cls == 0:
                    return self._unpark(rid)
        pop = getattr(self.inner, "pop_realtime", None)
        return pop(now) if pop is not None else None

    def remove(self, request_id: str) -> AdmittedRequest | None:
        if request_id in self.where:
            return self._unpark(request_id)
        return self.inner.remove(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.where or request_id in self.inner

    def __len__(self) -> int:
        return len(self.where) + len(self.inner)

    # ── placing port (QueueCore, flow control) ──
    def release(self, rooms: Mapping[str, WorkerRoom], in_flight: Mapping[str, AdmittedRequest],
                size: Callable[[AdmittedRequest], int], now: float) -> list[tuple[AdmittedRequest, frozenset[str]]]:
        """What may go to the router now, each with the workers it may go to (module doc)."""
        if not rooms:
            return []
        self.age_until(now)
        self._split(rooms, now)
        members: list[list[str]] = [[] for _ in self.groups]
        for wid in rooms:
            members[self.owner[wid]].append(wid)
        room = [sum(max(0, rooms[w].room) for w in ws) for ws in members]
        for rid, (g, _) in list(self.charged.items()):
            req = in_flight.get(rid)
            if req is None:  # routed, or put back (push took it off): no longer in flight
                del self.charged[rid]
            elif g < len(room):
                room[g] -= size(req)
        own = [frozenset(ws) for ws in members]
        out: list[tuple[AdmittedRequest, frozenset[str]]] = []

        def send(req: AdmittedRequest, g: int, seq: int, workers: frozenset[str]) -> None:
            self.charged[req.request_id] = (g, seq)
            room[g] -= size(req)
            out.append((req, workers))

        for g in range(len(self.groups)):  # 1. parked first
            while room[g] > 0:
                head = min(self._heads(self._ranges_of(g)), default=None)
                if head is None:
                    break
                seq = self.where[head[2]][1]
                send(self._unpark(head[2]), g, seq, own[g])
        while max(room) > 0:  # 2. the wrapped policy's order
            req = self.inner.pop(now)
            if req is None:
                break
            self.seq += 1
            g = self.group_of(req)
            if room[g] > 0:
                send(req, g, self.seq, own[g])
            else:
                self._park(req, self.seq, now)
        for g in range(len(self.groups)):  # 3. lent downwards
            for lender in range(len(self.groups) - 1, g, -1):
                if room[lender] <= 0 or any(True for _ in self._heads(self._ranges_of(lender))):
                    continue
                while room[lender] > 0:
                    head = min(self._heads(self._ranges_of(g)), default=None)
                    if head is None:
                        break
                    seq = self.where[head[2]][1]
                    send(self._unpark(head[2]), lender, seq, own[g] | own[lender])
        return out

    def range_of(self, req: AdmittedRequest) -> int:
        return range_of(cost(req), self.bounds)

    def group_of(self, req: AdmittedRequest) -> int:
        k = self.range_of(req)
        return next(g for g, (first, last) in enumerate(self.groups) if first <= k <= last)

    def shares(self, workers: int, now: float) -> list[float]:
        """x_k = N · d_k / Σ d (module doc); all zero while nothing was seen."""
        self._decay(now)
        rate_scale = math.log(2) / self.half_life_s
        demand = [self.arrived[k] * rate_scale + self.parked_work[k] / self.half_life_s for k in range(self.ranges)]
        total = sum(demand)
        return [workers * d / total if total > 0 else 0.0 for d in demand]

    # ── internals ──
    def _decay(self, now: float) -> None:
        if now > self.arrived_at:
            f = 0.5 ** ((now - self.arrived_at) / self.half_life_s)
            self.arrived = [a * f for a in self.arrived]
            self.arrived_at = now

    def _split(self, rooms: Mapping[str, WorkerRoom], now: float) -> None:
        """Re-derive the groups and their workers (module doc), keeping a split that is
        still a rounding of the shares."""
        n = len(rooms)
        shares = self.shares(n, now)
        if sum(shares) <= 0:
            merged = [(0, self.ranges - 1, float(n))]
        else:
            merged = merge_groups(shares, n)
        groups = [(a, b) for a, b, _ in merged]
        x = [s for _, _, s in merged]
        known = all(w in self.owner for w in rooms) and len(self.owner) == n
        if groups == self.groups and known:
            counts = [0] * len(groups)
            for w in rooms:
                counts[self.owner[w]] += 1
            if all(abs(c - s) < 1.0 for c, s in zip(counts, x, strict=True)):
                return
        target = split_counts(x, n)
        old = self.groups

        def new_group(first_range: int) -> int:
            return next(g for g, (a, b) in enumerate(groups) if a <= first_range <= b)

        members: list[list[str]] = [[] for _ in groups]
        pool: list[str] = []
        for w in sorted(rooms):
            g_old = self.owner.get(w)
            if g_old is None or g_old >= len(old):
                pool.append(w)
            else:
                members[new_group(old[g_old][0])].append(w)
        short_of = [g for g in range(len(groups)) if len(members[g]) < target[g]]
        for g, ws in enumerate(members):
            # a worker going to a shorter range should bring the least unprefilled work (its
            # new shorts wait behind it), one going to a longer range may bring the most
            ws.sort(key=lambda w: (rooms[w].backlog, w))
            to_longer = all(d > g for d in short_of)
            while len(ws) > target[g]:
                pool.append(ws.pop() if to_longer else ws.pop(0))
        pool.sort(key=lambda w: (rooms[w].backlog, w))
        for g, ws in enumerate(members):
            while len(ws) < target[g]:
                ws.append(pool.pop(0))
        assert not pool and sum(map(len, members)) == n
        self.groups = groups
        self.owner = {w: g for g, ws in enumerate(members) for w in ws}
        self.splits += 1

    def _ranges_of(self, g: int) -> range:
        first, last = self.groups[g]
        return range(first, last + 1)

    def _heads(self, ranges: Sequence[int] | range) -> Iterator[tuple[int, int, str]]:
        """The live head of each of `ranges`' parked heaps (stale entries dropped)."""
        for k in ranges:
            heap = self.parked[k]
            while heap:
                cls, seq, rid = heap[0]
                home = self.where.get(rid)
                if home is not None and home[1] == seq and home[3] == cls:
                    yield heap[0]
                    break
                heapq.heappop(heap)

    def _park(self, req: AdmittedRequest, seq: int, now: float) -> None:
        k = self.range_of(req)
        cls, due = aged_class(klass(req), req.arrival_s, now, self.ages_to)
        self.where[req.request_id] = (k, seq, req, cls)
        self.parked_work[k] += cost(req)
        heapq.heappush(self.parked[k], (cls, seq, req.request_id))
        if due < math.inf:
            heapq.heappush(self.aging, (due, seq, req.request_id))

    def age_until(self, now: float) -> None:
        """The policy's aging step (public: its entry points run it, and tests drive it): move each
        parked request due for promotion to the class it has aged into."""
        while self.aging and self.aging[0][0] <= now:
            _, seq, rid = heapq.heappop(self.aging)
            home = self.where.get(rid)
            if home is None or home[1] != seq:
                continue  # released, or parked again since
            k, _, req, _ = home
            cls, due = aged_class(klass(req), req.arrival_s, now, self.ages_to)
            self.where[rid] = (k, seq, req, cls)
            heapq.heappush(self.parked[k], (cls, seq, rid))
            if due < math.inf:
                heapq.heappush(self.aging, (due, seq, rid))

    def _unpark(self, rid: str) -> AdmittedRequest:
        k, _, req, _ = self.where.pop(rid)
        self.parked_work[k] -= cost(req)
        return req
