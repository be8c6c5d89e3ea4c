"""vLLM's per-step scheduler stats → the worker's EngineStats (heartbeats).

vLLM reports after every engine step (through the worker's StatLoggerBase): running and
waiting requests, KV usage as a fraction, and that step's prefix-cache queries / hits and
preemptions (deltas). The tracker keeps the latest gauges and sums the deltas:

    kv_blocks_used = round(kv_cache_usage × total),  kv_blocks_free = total − used
    prefix_hits / prefix_queries / preemptions = Σ over steps
    step_time_ms = EWMA (α = 0.2) of the interval between consecutive busy steps
    prefill_ms_per_token = E / P over the recent prefills (sums decayed by 1 − α per prefill):
        a step that ran while prompt tokens were queued (`queued_prefill` > 0 at the previous
        report) carried a prefill chunk; its time beyond a decode-only step (the EWMA of the
        steps that ran with none queued) is prefill time, summed into E; P sums the prompt
        tokens vLLM computed (its IterationStats: computed, i.e. not served from the prefix
        cache) as each prefill completes. 0 until a prefill is measured. The queue's flow
        control, the worker's `saturated` refusal and admission's deadlines read it as they
        read the simulated engine's (which knows its cost from its latency model).

KV blocks are counted in the fleet's blocks (`block_size` = the fleet's, 16 by default):
total = vLLM's blocks × vLLM's block size ÷ the fleet's, so the router compares KV room
across workers whatever their engine's block size (vLLM's is 128 on CPU by default). What
vLLM cannot know is added by the engine adapter at snapshot time: its running decodes' TPOT
slack (from the tokens it streams), the prompt tokens of
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
        self.queued_prefill = 0
        """Prompt tokens of the requests the worker handed to vLLM that have not produced their
        first token yet (kept by the engine adapter)."""
        self.decode_step_ms = 0.0
        """EWMA of the steps that ran with no prompt tokens queued (decode-only)."""
        self.prefill_ms_per_token = 0.0
        self._chunked_before = False
        """Prompt tokens were queued at the previous report: the step since carried a chunk."""
        self._excess_ms = 0.0
        """Prefill time (beyond a decode-only step) measured since the last completed prefill."""
        self._sum_excess_ms = 0.0
        self._sum_tokens = 0.0

    def configure(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size

    def on_arrival(self, now: float) -> None:
        """A request reached an idle engine: its first step is timed from here."""
        if self._last_busy_step is None:
            self._last_busy_step = now
            self._chunked_before = self.queued_prefill > 0

    def on_step(
        self, *, running: int, waiting: int, kv_usage: float, prefix_hits: int, prefix_queries: int, now: float,
        prompt_tokens_computed: int = 0,
    ) -> None:
        """One SchedulerStats report (deltas for hits and queries), with the prompt tokens vLLM
        computed for the prefills this step completed."""
        if self._last_busy_step is not None:
            dt = (now - self._last_busy_step) * 1000.0
            self.step_time_ms = _ewma(self.step_time_ms, dt)
            if self._chunked_before:
                self._excess_ms += max(0.0, dt - self.decode_step_ms)
            else:
                self.decode_step_ms = _ewma(self.decode_step_ms, dt)
        if prompt_tokens_computed > 0:
            self._sum_excess_ms = (1 - EWMA_ALPHA) * self._sum_excess_ms + self._excess_ms
            self._sum_tokens = (1 - EWMA_ALPHA) * self._sum_tokens + prompt_tokens_computed
            self._excess_ms = 0.0
            self.prefill_ms_per_token = self._sum_excess_ms / self._sum_tokens
        self._last_busy_step = now if running > 0 or self.queued_prefill > 0 else None
        self._chunked_before = self.queued_prefill > 0
        self.running = running
        self.waiting = waiting
        self.kv_usage = kv_usage
        self.prefix_hits += prefix_hits
        self.prefix_queries += prefix_queries

    def on_preempted(self, n: int) -> None:
        self.preemptions += n

    def snapshot(self, *, open_requests: int, queued_prefill_tokens: int,
                 tpot_slack_ms: float | None = None) -> EngineStats:
        """`tpot_slack_ms`: the running decodes' TPOT slack, which the engine adapter keeps
        from the tokens it streams (engine.py)."""
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
            prefill_ms_per_token=self.prefill_ms_per_token,
            tpot_slack_ms=tpot_slack_ms,
        )


def _ewma(current: float, sample: float) -> float:
    return sample if current == 0.0 else EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * current
