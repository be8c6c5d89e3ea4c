"""vLLM's per-step scheduler stats → the worker's EngineStats (heartbeats).

vLLM reports after every engine step (through the worker's StatLoggerBase): running and
waiting requests, KV usage as a fraction, and that step's prefix-cache queries / hits and
preemptions (deltas). The tracker keeps the latest gauges and sums the deltas:

    kv_blocks_used = round(kv_cache_usage × total),  kv_blocks_free = total − used
    prefix_hits / prefix_queries / preemptions = Σ over steps
    step_time_ms = EWMA (α = 0.2) of the interval between consecutive busy steps

KV blocks are counted in the fleet's blocks (`block_size` = the fleet's, 16 by default):
total = vLLM's blocks × vLLM's block size ÷ the fleet's, so the router compares KV room
across workers whatever their engine's block size (vLLM's is 128 on CPU by default). What
vLLM cannot know is added by the engine adapter at snapshot time: the prompt tokens of
requests the worker accepted that have not produced their first token yet (queued
prefill, the router's P-token load, counted at full prompt length, as vLLM's own
queued-token admission does), and a clamp of running / waiting / KV used to the requests
actually open (vLLM's last report can trail the last finished or aborted request by a
step; with no request open, vLLM holds no block but evictable cached ones, which it
counts as free).
"""

from __future__ import annotations

from tokenyard.services.worker.engine import EngineStats

EWMA_ALPHA = 0.2


class StatsTracker:
    def __init__(self, fleet_block_size: int, num_blocks: int = 0, block_size: int = 0):
        self.fleet_block_size = fleet_block_size
        self.num_blocks = num_blocks
        """vLLM's KV blocks."""
        self.block_size = block_size
        """vLLM's KV block size."""
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.prefix_hits = 0
        self.prefix_queries = 0
        self.preemptions = 0
        self.step_time_ms = 0.0
        self._last_busy_step: float | None = None

    def configure(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size

    def on_step(
        self, *, running: int, waiting: int, kv_usage: float, prefix_hits: int, prefix_queries: int, now: float
    ) -> None:
        """One SchedulerStats report (deltas for hits and queries)."""
        if running > 0:
            if self._last_busy_step is not None:
                dt = (now - self._last_busy_step) * 1000.0
                self.step_time_ms = dt if self.step_time_ms == 0.0 else (
                    EWMA_ALPHA * dt + (1 - EWMA_ALPHA) * self.step_time_ms
                )
            self._last_busy_step = now
        else:
            self._last_busy_step = None
        self.running = running
        self.waiting = waiting
        self.kv_usage = kv_usage
        self.prefix_hits += prefix_hits
        self.prefix_queries += prefix_queries

    def on_preempted(self, n: int) -> None:
        self.preemptions += n

    def snapshot(self, *, open_requests: int, queued_prefill_tokens: int) -> EngineStats:
        running = min(self.running, open_requests)
        waiting = min(self.waiting, open_requests - running)
        total = self.num_blocks * self.block_size // self.fleet_block_size
        used = min(total, round(self.kv_usage * total)) if open_requests else 0
        return EngineStats(
            running=running,
            waiting=waiting,
            queued_prefill_tokens=queued_prefill_tokens,
            kv_blocks_used=used,
            kv_blocks_free=total - used,
            block_size=self.fleet_block_size,
            step_time_ms=self.step_time_ms,
            prefix_hits=self.prefix_hits,
            prefix_queries=self.prefix_queries,
            preemptions=self.preemptions,
        )
