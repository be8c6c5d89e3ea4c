"""Mitosis scaling (seed 002 §3.2, docs/ARCHITECTURE.md §7): grow, split, shrink and merge
macro-instances from their utilisation and SLO-violation histories. Pure: samples and `now`
come in, decisions go out; the controller applies them to its groups and hands worker
additions/removals to a Provisioner.

Per macro-instance m, every tick adds a sample (t, u, v):
  u = mean compute utilisation of its workers (heartbeat `compute_util`)
  v = max(v_w, q), two proxies for the SLO-violation rate:
      v_w = share of its workers missing an SLO now: saved TPOT slack < 0, or pending
            prefill time > the TTFT SLO (what the heartbeats show);
      q   = the fleet's backlog share (`backlog_late_share`): of the requests the fleet
            holds (waiting in the priority queue + in flight), the share waiting in the
            queue past the TTFT SLO. Under flow control the queue, not the workers, holds
            the backlog while the fleet is saturated: the workers look busy but within SLO,
            so v_w alone never sees an overload. The queue is one for the fleet, so q counts
            for every macro-instance alike.
Over a window W the history "stays" above a level when it spans W and its mean is above it.
  grow    mean v > 5% or mean u > 85% over W_grow (5 min)    → one worker more for m
  split   |m| > N_upper                                       → its last N_lower workers
                                                                form a new macro-instance
  shrink  mean u < 40% and mean v ≤ 5% over W_shrink (10 min), → its last worker is drained
          |m| > 1                                                and removed (never while
                                                                the queue holds a late backlog)
  merge   |m| ≤ N_lower after a shrink — or cold as for a shrink but unable to (one
          worker, or the fleet at its minimum) — and a neighbour n (the macro-instances in
          id order, the next one first) with mean u < 40% and |m| + |n| ≤ N_upper
                                                              → m's workers join n
          (without the second case two idle one-worker macro-instances never merged)
After an action on m, its history restarts (a new window must build up before the next).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tokenyard.shared.schemas import QueueStats


@dataclass
class MitosisConfig:
    n_lower: int = 2
    n_upper: int = 8
    grow_violation: float = 0.05
    grow_util: float = 0.85
    grow_window_s: float = 300.0
    shrink_util: float = 0.40
    shrink_window_s: float = 600.0
    max_workers: int = 1 << 20
    """The fleet never grows past this many workers."""
    min_workers: int = 1
    """…nor shrinks below this many."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_lower < self.n_upper:
            raise ValueError("mitosis needs 1 ≤ N_lower < N_upper")


def mitosis_config(macro_size: int, **overrides) -> MitosisConfig:
    """The seed's mitosis for macro-instances of `macro_size` (§5.2 sizes them by cluster):
    split past it, into groups of half of it; windows and thresholds as MitosisConfig's. The
    live controller (`tokenyard macro --scale`) and the simulator (`--mitosis`) both start here."""
    return MitosisConfig(n_lower=max(1, macro_size // 2), n_upper=max(2, macro_size), **overrides)


@dataclass(frozen=True)
class Decision:
    """One scaling action. `kind`: `grow` (add a worker to `macro_id`), `split` (move
    `workers` out of `macro_id` into a new macro-instance), `shrink` (remove `workers[0]` from
    `macro_id`), `merge` (move all of `macro_id`'s workers into `into`)."""

    kind: str
    macro_id: str
    workers: tuple[str, ...] = ()
    into: str = ""


class History:
    """Samples (t, u, v) with running sums, so a window's mean costs a bisection, not a pass
    over the window: at a 0.1 s tick a 10-minute window holds 6,000 samples, and summing them
    every tick for every macro-instance was the simulator's whole run time."""

    COMPACT_AT = 4096
    """Samples dropped before the list is cut down (amortised O(1) per sample)."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.cu: list[float] = []
        self.cv: list[float] = []
        """Σ u, Σ v over every sample up to and including this one (since the history began)."""
        self.head = 0
        """Index of the oldest sample kept."""

    def add(self, t: float, u: float, v: float, keep_s: float) -> None:
        self.t.append(t)
        self.cu.append((self.cu[-1] if self.cu else 0.0) + u)
        self.cv.append((self.cv[-1] if self.cv else 0.0) + v)
        # Keep one sample at or past the window's far edge: dropping every sample older than
        # the window left a history that never spanned it (ticks rarely land on its edge
        # exactly), so a window as long as the longest one — shrink's — never filled.
        while len(self.t) - self.head > 1 and t - self.t[self.head + 1] >= keep_s:
            self.head += 1
        if self.head > self.COMPACT_AT and self.head * 2 > len(self.t):  # compact; one sample before head stays for the sums
            cut = self.head - 1
            del self.t[:cut], self.cu[:cut], self.cv[:cut]
            self.head = 1

    def mean_over(self, now: float, window_s: float) -> tuple[float, float] | None:
        """Mean (u, v) over the samples of the last `window_s` (t ≥ now − window_s), if the
        history spans the whole window."""
        if len(self.t) == self.head or now - self.t[self.head] < window_s:
            return None
        i = bisect.bisect_left(self.t, now - window_s, lo=self.head)
        n = len(self.t) - i
        if n == 0:
            return None
        before_u = self.cu[i - 1] if i > 0 else 0.0
        before_v = self.cv[i - 1] if i > 0 else 0.0
        return (self.cu[-1] - before_u) / n, (self.cv[-1] - before_v) / n


class Mitosis:
    def __init__(self, cfg: MitosisConfig):
        self.cfg = cfg
        self.hist: dict[str, History] = {}

    def observe(self, macro_id: str, now: float, util: float, violation: float) -> None:
        keep = max(self.cfg.grow_window_s, self.cfg.shrink_window_s)
        self.hist.setdefault(macro_id, History()).add(now, util, violation, keep)

    def forget(self, macro_id: str) -> None:
        self.hist.pop(macro_id, None)

    def _mean(self, mid: str, now: float, window_s: float) -> tuple[float, float] | None:
        h = self.hist.get(mid)
        return h.mean_over(now, window_s) if h else None

    def decide(self, groups: dict[str, list[str]], now: float, starting: int = 0) -> list[Decision]:
        """The actions for this tick, given the groups (macro id → workers, in order) and the
        workers asked for and not yet joined (`starting`: they count against max_workers)."""
        cfg = self.cfg
        total = sum(len(ws) for ws in groups.values()) + starting
        out: list[Decision] = []
        acted: set[str] = set()
        for mid in sorted(groups):
            if mid in acted:  # a merge target this tick
                continue
            ws = groups[mid]
            if len(ws) > cfg.n_upper:
                out.append(Decision("split", mid, tuple(ws[-cfg.n_lower:])))
                acted.add(mid)
                continue
            hot = self._mean(mid, now, cfg.grow_window_s)
            if hot and (hot[1] > cfg.grow_violation or hot[0] > cfg.grow_util) and total < cfg.max_workers:
                out.append(Decision("grow", mid))
                total += 1
                acted.add(mid)
                continue
            cold = self._mean(mid, now, cfg.shrink_window_s)
            if cold and cold[0] < cfg.shrink_util and cold[1] <= cfg.grow_violation:
                stay = ws
                if len(ws) > 1 and total > cfg.min_workers:
                    out.append(Decision("shrink", mid, (ws[-1],)))
                    total -= 1
                    acted.add(mid)
                    stay = ws[:-1]
                if len(stay) <= cfg.n_lower:
                    into = self._merge_target(groups, mid, len(stay), now, acted)
                    if into:
                        out.append(Decision("merge", mid, tuple(stay), into))
                        acted |= {mid, into}
        for mid in acted:
            self.forget(mid)
        return out

    def _merge_target(self, groups: dict[str, list[str]], mid: str, size: int, now: float,
                      acted: set[str]) -> str | None:
        order = sorted(groups)
        i = order.index(mid)
        for j in (i + 1, i - 1):
            if not 0 <= j < len(order) or order[j] in acted:
                continue
            n = order[j]
            light = self._mean(n, now, self.cfg.shrink_window_s)
            if light and light[0] < self.cfg.shrink_util and size + len(groups[n]) <= self.cfg.n_upper:
                return n
        return None


def backlog_late_share(queues: list[QueueStats], ttft_slo_ms: float) -> float:
    """Of the requests the fleet holds — waiting in the priority queue (N = Σ depth) or in
    flight (F) — the share that waits in the queue longer than the TTFT SLO T:

        late = N · max(0, 1 − D·T / W),   share = late / (N + F)

    W = Σ work_tokens waiting, D = Σ drain_tokens_per_s (what the queue routed per second
    lately): served first come first served at the drain rate, the k-th of N equal requests
    leaves after k·W/(N·D), so those past D·T/W of the line are late. A replica reporting
    headroom is not the bottleneck (what waits in it is about to leave): it counts no late
    requests, as admission's feasibility check reads the same state; nor does one whose backlog is
    too young to have measured a drain (`drain_measured`). With work waiting and no drain, every
    waiting request is late. Classes are pooled (FCFS): a strict or weighted
    queue serves its top class sooner, which this ignores."""
    waiting = sum(sum(q.depth) for q in queues)
    held = waiting + sum(q.in_flight for q in queues)
    if held == 0:
        return 0.0
    late = 0.0
    for q in queues:
        n, w = sum(q.depth), sum(q.work_tokens)
        if n == 0 or q.headroom > 0 or not q.drain_measured:  # a backlog too young to be late
            continue
        late += n if q.drain_tokens_per_s <= 0 else n * max(0.0, 1.0 - q.drain_tokens_per_s * ttft_slo_ms / 1000.0 / max(w, 1))
    return late / held
