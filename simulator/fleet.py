"""One simulated instance: the live worker's two cores side by side — WorkerCore (offers,
stream bookkeeping, heartbeats, phase control) and SimEngineCore (the step) — plus what the
simulator observes of it (busy time, batch-size samples).

Heartbeats: the live worker publishes one every 100 ms. An instance whose engine has not
changed since its last heartbeat would publish the same numbers again, so the simulator
sends it only as a keep-alive (every `keepalive_s`, under the router's and queue's
staleness limits); `dirty` marks a change (a request added, a step run, a phase control).
"""

from __future__ import annotations

from array import array
from collections import deque

from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.sim.core import SimEngineCore, StepResult
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.shared.schemas import EngineStats, Heartbeat
from tokenyard.shared.tokenizer import ByteTokenizer


class SimInstance:
    __slots__ = ("id", "worker", "engine", "busy", "dirty", "last_hb_s", "last_hb", "pending", "busy_s", "bs_samples",
                 "steps", "fold_times", "ahead", "owed", "owed_stats")

    def __init__(
        self,
        worker_id: str,
        model: str,
        prof: LatencyProfile,
        block_size: int,
        num_blocks: int,
        tpot_slo_ms: float,
        flow_control: bool = True,
        **engine_options,
    ):
        self.id = worker_id
        self.worker = WorkerCore(WorkerConfig(worker_id=worker_id, model=model, engine="sim", flow_control=flow_control),
                                 ByteTokenizer())
        self.engine = SimEngineCore(prof, block_size=block_size, num_blocks=num_blocks, tpot_slo_ms=tpot_slo_ms, **engine_options)
        self.busy = False
        """A step is in flight (its STEP_DONE event is queued)."""
        self.dirty = True
        self.last_hb_s = float("-inf")
        self.last_hb: Heartbeat | None = None
        """The latest heartbeat sent; a repeat of it goes out as a keep-alive."""
        self.pending: StepResult | None = None
        self.fold_times: list[float] | None = None
        """With a folded step pending: the virtual time each of its steps ends."""
        self.busy_s = 0.0
        self.steps = 0
        self.bs_samples = array("H")
        """Running batch size at every sample tick."""
        self.ahead: deque[tuple[float, EngineStats]] = deque()
        """(tick time, the engine's stats then) for the ticks a fold across ticks crossed
        (across.py): by the tick, the engine itself is further on. None for a silent tick
        (tick.py), which reads no stats."""
        self.owed: float | None = None
        """A silent tick's time, where this worker's heartbeat was held back (tick.py)."""
        self.owed_stats: EngineStats | None = None
        """The stats of the heartbeat held back, where the worker was not busy then (a busy
        one's is superseded by the next tick's, which it sends for sure)."""

    def stats_at(self, now: float) -> EngineStats:
        """The engine's stats as a tick at `now` sees them: kept by a fold across that tick,
        else the engine's own."""
        ahead = self.ahead
        if ahead:
            while ahead and ahead[0][0] < now:
                ahead.popleft()
            if ahead and ahead[0][0] == now:
                stats = ahead[0][1]
                assert stats is not None, "a tick read the stats that a fold across ticks kept for no one"
                return stats
        return self.engine.stats()
