"""Bubble queues (seed 004): length partitions within a class, each served in its turn.

Length L(r) = prompt + max_tokens. A class's requests sit in partitions [lo, hi) of L, kept
sorted by lo, initially the log-spaced bounds [0,512) [512,2k) [2k,8k) [8k,∞). Service is
round robin in ascending length: a round visits the non-empty partitions shortest first and
takes up to quantum_i requests from each (least deadline first inside), so short requests
still go first and a long one waits at most one round once overdue (below), however many
short ones arrive:
    quantum_i = max(1, round(L̄_max / L̄_i)) · (2 if hot else 1)
L̄_i the mean length of partition i's waiting requests, L̄_max the largest L̄_j among the
non-empty partitions: every turn is worth about one request of the longest partition, so the
partitions share the work, not the request count (deficit round robin in tokens over length
ranges). A partition of short requests gives many per turn, the longest gives one. (With L̄
the mean of all waiting requests instead, a short flood pulls L̄ down to the short length, each
turn of the shorts gives one or two requests while a long one's turn gives 40× their work, and
the shorts back up behind a handful of long requests.)

Dynamics (`dynamic=True`; `fixed` partitions turn them all off):
  * a partition that empties is dropped, leaving a gap (when the whole class empties the base
    bounds come back, as length anchors until they too have served and emptied);
  * a request whose L lies in a gap [g_lo, g_hi) between partitions gets a temporary bubble
    queue of width w = min(bubble_width, g_hi − g_lo) centred on L, shifted to fit the gap;
  * load_i = n_i / mean_j(n_j) over the non-empty partitions (n = requests waiting: a turn
    serves requests, whatever their length); a partition turns hot when load_i > 1.10 and
    cools when load_i < 0.90 (hysteresis); a hot one takes 2 per round;
  * adjacent non-empty partitions both under 50% load merge into one covering both (and the
    gap between), so lightly used ranges do not each cost a turn.
Shorter ranges first until a longer one is overdue (`yields=True`, the default): in a round a
partition other than the shortest non-empty one is passed over while its head is not overdue,
    overdue(r)  ⇔  now − arrival(r) ≥ OVERDUE · (deadline(r) − arrival(r)),   OVERDUE = 2
i.e. it has waited twice its own TTFT span (P1: 2 · (5 s + its prefill); P3, no deadline:
twice the loosest finite target). So in a short flood the ranges go shortest first, in
deadline order within each (not SJF by exact length: a 30k-token prompt does not also wait
behind every 9k one), and a longer range's head, once overdue, gets its turn at the next
round as before: it waits at most its overdue time plus one round. Past capacity this moves
the backlog off the short range, the bulk of the traffic, onto the longer ones until they are
overdue (docs/results-bubble.md, round 9: flood 120, short p50 0.69 → 0.40 s, long p99 19.5 →
17.5 s). A line never told the time (`at`) treats every head as overdue: round 5's rule, every
range its turn each round (`bubble-placed` keeps it).
`ShortestLine` (lines.py) is the SJF baseline that starves long requests under sustained
short load; `fixed` is the static-partition baseline (the base bounds for ever, one request
per partition per round).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenyard.services.priority_queue.policies.base import cost, deadline
from tokenyard.services.priority_queue.policies.lines import DeadlineLine
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.shared.slo import FINITE_TTFT_TARGET_S

BASE_BOUNDS: tuple[float, ...] = (0.0, 512.0, 2048.0, 8192.0, float("inf"))
HOT, COOL, MERGE = 1.10, 0.90, 0.50
OVERDUE = 2.0
"""A longer partition's head is overdue once it has waited this many times its TTFT span."""


@dataclass
class Partition:
    lo: float
    hi: float
    bubble: bool = False
    hot: bool = False
    tokens: int = 0
    """Σ L of the requests waiting here."""
    line: DeadlineLine = field(default_factory=DeadlineLine)

    def __len__(self) -> int:
        return len(self.line)


class BubbleLine:
    def __init__(self, bubble_width: float = 1024.0, bounds: Sequence[float] = BASE_BOUNDS,
                 dynamic: bool = True, work_turns: bool = True, yields: bool = True,
                 overdue: float = OVERDUE) -> None:
        self.bubble_width = float(bubble_width)
        self.bounds = tuple(bounds)
        self.dynamic = dynamic
        self.work_turns = work_turns
        """True: a turn is worth L̄_max (the longest partition's mean); False: the earlier
        rule, L̄ = the mean of all waiting requests (kept for the comparison in
        docs/results-bubble.md)."""
        self.yields = yields and dynamic
        """True: a longer partition yields its turn while its head is not overdue (above)."""
        self.overdue = overdue
        """OVERDUE; another value only for the sensitivity study (bench.bubble `bubble-o<x>`)."""
        self.now = float("inf")
        """The time the line was last told (`at`); never told: every head is overdue."""
        self.parts: list[Partition] = []
        self._reset()
        self._home: dict[str, tuple[Partition, int]] = {}
        """request id → (its partition, the class it was keyed in)."""
        self.cursor = -1.0
        """lo of the partition being served this round (−1: a round starts)."""
        self.taken = 0
        """Requests the partition at the cursor has given this round."""
        self.bubbles_made = 0
        self.tokens = 0
        self.merges = 0

    def _reset(self) -> None:
        self.parts = [Partition(lo, hi) for lo, hi in zip(self.bounds, self.bounds[1:], strict=False)]

    # ── line port ──
    def at(self, now: float) -> None:
        self.now = now

    def push(self, req: AdmittedRequest, cls: int) -> None:
        part = self._partition_for(cost(req))
        part.line.push(req, cls)
        part.tokens += cost(req)
        self.tokens += cost(req)
        self._home[req.request_id] = (part, cls)
        self._rebalance()

    def peek(self) -> AdmittedRequest | None:
        turn = self._turn()
        return None if turn is None else turn[0].line.peek()

    def pop(self) -> AdmittedRequest | None:
        turn = self._turn()
        if turn is None:
            return None
        part, same_turn = turn
        req = part.line.pop()
        assert req is not None
        self.cursor, self.taken = part.lo, (self.taken + 1 if same_turn else 1)
        self._forget(req, part)
        return req

    def remove(self, request_id: str) -> AdmittedRequest | None:
        home = self._home.get(request_id)
        if home is None:
            return None
        req = home[0].line.remove(request_id)
        assert req is not None
        self._forget(req, home[0])
        return req

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._home

    def partition_of(self, request_id: str) -> Partition | None:
        """The partition a waiting request is kept in (None: not waiting here)."""
        home = self._home.get(request_id)
        return None if home is None else home[0]

    def __len__(self) -> int:
        return len(self._home)

    # ── internals ──
    def _forget(self, req: AdmittedRequest, part: Partition) -> None:
        del self._home[req.request_id]
        part.tokens -= cost(req)
        self.tokens -= cost(req)
        if self.dynamic:
            if not len(part):
                self.parts.remove(part)
                if not self.parts:
                    self._reset()
            self._rebalance()

    def _turn(self) -> tuple[Partition, bool] | None:
        """Whose turn it is: the partition at the cursor while its quantum lasts (True: the
        same turn goes on), else the next non-empty one above it, else (a new round) the
        shortest non-empty one; a partition other than the shortest non-empty one is passed
        over while it yields (its head not overdue)."""
        first = None
        live = sum(1 for p in self.parts if len(p))
        for p in self.parts:
            if not len(p):
                continue
            if first is None:
                first = p
            elif self.yields and not self._overdue(p):
                continue
            if p.lo == self.cursor and self.taken < self._quantum(p, live):
                return p, True
            if p.lo > self.cursor:
                return p, False
        return None if first is None else (first, False)

    def _overdue(self, p: Partition) -> bool:
        head = p.line.peek()
        assert head is not None
        cls = self._home[head.request_id][1]
        span = deadline(head, cls) - head.arrival_s
        if span == float("inf"):
            span = FINITE_TTFT_TARGET_S[cls]
        return self.now - head.arrival_s >= self.overdue * span

    def _quantum(self, p: Partition, live: int) -> int:
        """Requests a partition may give in one turn: the longest partition's mean length over
        its own, rounded, at least 1; twice that when hot. Fixed partitions: 1."""
        if not self.dynamic:
            return 1
        if self.work_turns:
            ref = max(q.tokens / len(q) for q in self.parts if len(q))
        else:
            ref = self.tokens / len(self._home)
        n = max(1, round(ref / (p.tokens / len(p))))
        return 2 * n if p.hot else n

    def _partition_for(self, length: float) -> Partition:
        los = [p.lo for p in self.parts]
        i = bisect.bisect_right(los, length) - 1
        if i >= 0 and length < self.parts[i].hi:
            return self.parts[i]
        gap_lo = self.parts[i].hi if i >= 0 else 0.0
        gap_hi = self.parts[i + 1].lo if i + 1 < len(self.parts) else float("inf")
        width = min(self.bubble_width, gap_hi - gap_lo)
        lo = max(gap_lo, min(length - width / 2, gap_hi - width))
        part = Partition(lo, lo + width, bubble=True)
        self.parts.insert(i + 1, part)
        self.bubbles_made += 1
        return part

    def _rebalance(self) -> None:
        """Hysteresis on each partition's load, then merge adjacent cool non-empty ones."""
        if not self.dynamic or not self._home:
            return
        live = [p for p in self.parts if len(p)]
        mean = len(self._home) / len(live)
        for p in live:
            load = len(p) / mean
            if load > HOT:
                p.hot = True
            elif load < COOL:
                p.hot = False
        i = 0
        while i + 1 < len(self.parts):
            a, b = self.parts[i], self.parts[i + 1]
            if 0 < len(a) < MERGE * mean and 0 < len(b) < MERGE * mean:
                self._merge(a, b)
                continue
            i += 1

    def _merge(self, a: Partition, b: Partition) -> None:
        for req in b.line.requests():
            rid = req.request_id
            b.line.remove(rid)
            cls = self._home[rid][1]
            a.line.push(req, cls)
            self._home[rid] = (a, cls)
        a.hi, a.bubble, a.hot, a.tokens = b.hi, False, a.hot or b.hot, a.tokens + b.tokens
        if self.cursor == b.lo:
            self.cursor = a.lo
        self.parts.remove(b)
        self.merges += 1


def fixed_line(bounds: Sequence[float] = BASE_BOUNDS) -> BubbleLine:
    return BubbleLine(bounds=bounds, dynamic=False)
