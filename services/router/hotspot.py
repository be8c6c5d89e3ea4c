"""Hot-spot detector (seed 000 §3.2), two stages, plus the round-robin fallback.

A request's prefix key is its chain hash at depth `prefix_blocks` (the block that names a
shared system prompt or conversation head). Over a sliding window (default 1 min):

    stage 1 (warning):  x / x̄  >  |M| / |M̄|
        x = requests in the window with this prefix, x̄ = all requests in the window,
        M = instances holding the prefix block, M̄ = all instances.
        Hot traffic outweighs the instances that hold its cache.
    stage 2 (filter):   under warning, the same instance chosen 2 × |M| times in a row for
        this prefix  ⇒  that instance is filtered out of this prefix's candidates for
        `cooldown_s`; the request goes elsewhere and its cache spreads (|M| grows, the
        threshold with it).

If stage 2 fires `fallback_after` times within `fallback_window_s`, the router routes round
robin for `fallback_for_s` (seed §5.1: "when the detector keeps firing, switch to polling").
Warnings wait for `min_requests` in the window: a share over three requests is not a
statistic. Pure: time comes in as `now`. Memory is bounded by the prefixes in the window: a
prefix that leaves it takes its run and its spent cool-downs along.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class HotspotConfig:
    window_s: float = 60.0
    """Seed 000 §5.1: "set the hot-spot detection window to 1 minute"."""
    min_requests: int = 20
    prefix_blocks: int = 1
    cooldown_s: float = 10.0
    fallback_after: int = 3
    fallback_window_s: float = 60.0
    fallback_for_s: float = 30.0


@dataclass
class HotspotDetector:
    cfg: HotspotConfig = field(default_factory=HotspotConfig)

    def __post_init__(self) -> None:
        self._window: deque[tuple[float, object]] = deque()
        self._counts: Counter = Counter()
        self._streak: dict[object, tuple[str, int]] = {}
        self._blocked: dict[object, dict[str, float]] = {}
        self._firings: deque[float] = deque()
        self.fallback_until = float("-inf")
        self.fired = 0
        """Stage-2 firings so far (a counter for metrics and tests)."""

    def key(self, req: AdmittedRequest) -> object | None:
        k = self.cfg.prefix_blocks
        return req.block_hashes[k - 1] if len(req.block_hashes) >= k else None

    def observe(self, key: object | None, now: float) -> None:
        """Count one request (its prefix key, None if it has none) into the window."""
        w, c, horizon = self._window, self._counts, now - self.cfg.window_s
        while w and w[0][0] < horizon:
            _, old = w.popleft()
            c[old] -= 1
            if not c[old]:  # the prefix left the window: forget its run
                del c[old]
                self._streak.pop(old, None)
                for gone in [k for k in self._blocked if k not in c]:  # and spent cool-downs
                    self.blocked(gone, now)
        w.append((now, key))
        c[key] += 1

    def warning(self, key: object | None, holders: int, instances: int) -> bool:
        """Stage 1 for a prefix held by `holders` of `instances` instances."""
        total = len(self._window)
        if key is None or holders == 0 or instances == 0 or total < self.cfg.min_requests:
            return False
        return self._counts[key] * instances > holders * total

    def record(self, key: object | None, worker_id: str, warned: bool, holders: int, now: float) -> bool:
        """Stage 2 after a decision; True if it fired (the worker is now filtered for this key)."""
        if key is None:
            return False
        if not warned:
            self._streak.pop(key, None)
            return False
        last, run = self._streak.get(key, ("", 0))
        run = run + 1 if last == worker_id else 1
        if run < 2 * max(holders, 1):
            self._streak[key] = (worker_id, run)
            return False
        del self._streak[key]
        self._blocked.setdefault(key, {})[worker_id] = now + self.cfg.cooldown_s
        self.fired += 1
        f, horizon = self._firings, now - self.cfg.fallback_window_s
        f.append(now)
        while f and f[0] < horizon:
            f.popleft()
        if len(f) >= self.cfg.fallback_after:
            self.fallback_until = now + self.cfg.fallback_for_s
            f.clear()
        return True

    def kept(self) -> dict[str, int]:
        """The prefixes it keeps state for, counted: in the window (`counted`), with a run of
        placements on one worker (`streaks`), cooling a worker down (`cooling`). A prefix that
        leaves the window leaves the first two, and the third once its cool-down is spent."""
        return {"counted": len(self._counts), "streaks": len(self._streak), "cooling": len(self._blocked)}

    def fallback(self, now: float) -> bool:
        return now < self.fallback_until

    def blocked(self, key: object | None, now: float) -> list[str]:
        """Workers filtered out for this prefix now."""
        b = self._blocked.get(key) if key is not None else None
        if not b:
            return []
        for wid in [w for w, until in b.items() if until <= now]:
            del b[wid]
        if not b:
            del self._blocked[key]
        return list(b)


@dataclass
class HotspotFilter:
    """Stage 2's filter: drops the instances the detector cooled down for the request's prefix."""

    detector: HotspotDetector
    name: str = "hot-spot"

    def keep(self, req: AdmittedRequest, view: FleetView, now: float) -> np.ndarray:
        blocked = self.detector.blocked(self.detector.key(req), now)
        if not blocked:
            return np.True_
        mask = np.ones(view.n, dtype=np.bool_)
        for wid in blocked:
            i = view.slot.get(wid)
            if i is not None:
                mask[i] = False
        return mask
