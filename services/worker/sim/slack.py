"""EcoServe's engine-side inputs for the simulated engine, kept on the engine's own clock
(the sum of its step durations — the same time base on the real clock, ÷ speed, and in the
cluster simulator). A real engine (vLLM) runs on the wall clock instead: its adapter moves
the clock to the time it sees each output (`advance_to`) and asks for the slack at the time
of the heartbeat (`min_slack_ms(d, now_s)`), so a decode whose tokens stall loses slack as
time passes, not only as tokens come:

  saved TPOT slack of request r  = (g_r + 1 + k_r) · STP_r − (clock − t_first(r)) − k_r · d
      (shared.ecoserve.saved_slack_ms) k_r = max_tokens − 2 − g_r tokens still to come after
      its next, d = the engine's decode step time now
      g_r = tokens r produced after its first, STP_r = its TPOT SLO (the request's own, or
      the engine's default); the engine reports the minimum over the requests decoding now
      (None when none decodes): a prefill delays every decode, so the tightest one counts.
  compute utilisation            = tokens scheduled in the last step ÷ the step token budget
  prefill cost per token         = step time of one full-budget fresh chunk ÷ the budget
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.shared.ecoserve import saved_slack_ms
from tokenyard.shared.slo import DEFAULT_TPOT_SLO_MS


class SlackClock:
    def __init__(self, default_tpot_slo_ms: float = DEFAULT_TPOT_SLO_MS):
        self.default_tpot_slo_ms = default_tpot_slo_ms
        self.clock_s = 0.0
        self._first: dict[str, tuple[float, float]] = {}
        """request id → (engine time of its first token, its TPOT SLO in ms)."""
        self._after: dict[str, int] = {}
        """request id → tokens produced after its first."""
        self._max: dict[str, int] = {}
        """request id → its max_tokens (0: unknown)."""

    def on_step(
        self,
        duration_s: float,
        outputs: Iterable[EngineOutput],
        slo_ms: Callable[[str], float],
        max_tokens: Callable[[str], int] | None = None,
    ) -> None:
        """A step of `duration_s` ended, delivering `outputs`; `slo_ms(id)` is a request's own
        TPOT SLO (≤ 0: the default), `max_tokens(id)` its output length (None: unknown, its
        slack then covers its next token only), each asked once, at its first token."""
        self.clock_s += duration_s
        for out in outputs:
            rid = out.request_id
            if out.finished:
                self._first.pop(rid, None)
                self._after.pop(rid, None)
                self._max.pop(rid, None)
            elif out.new_token_ids:
                if rid in self._first:
                    self._after[rid] += len(out.new_token_ids)
                else:
                    slo = slo_ms(rid)
                    self._first[rid] = (self.clock_s, slo if slo > 0 else self.default_tpot_slo_ms)
                    self._after[rid] = len(out.new_token_ids) - 1
                    self._max[rid] = max_tokens(rid) if max_tokens is not None else 0

    def on_steps(
        self,
        durations: list[float],
        outputs: Iterable[EngineOutput],
        slo_ms: Callable[[str], float],
        max_tokens: Callable[[str], int] | None = None,
    ) -> None:
        """Several steps that ended, folded (fold.py): the clock advances by each duration in
        turn (as step by step, to the bit), then `outputs`, each with its tokens of those steps,
        count as one step's. Every request in a fold had its first token before it."""
        for d in durations[:-1]:
            self.clock_s += d
        self.on_step(durations[-1], outputs, slo_ms, max_tokens)

    def advance_to(self, now_s: float) -> None:
        """A wall-clock engine: the outputs that follow (`on_step(0.0, …)`) came at `now_s`
        (monotonic seconds; the clock never runs back)."""
        self.clock_s = max(self.clock_s, now_s)

    def forget(self, request_id: str) -> None:
        """A request left without a finished output of its own (an abort)."""
        self._first.pop(request_id, None)
        self._after.pop(request_id, None)
        self._max.pop(request_id, None)

    def min_slack_ms(self, decode_ms: float = 0.0, now_s: float | None = None) -> float | None:
        """The tightest decode's slack; `decode_ms` is the engine's decode step time now (the
        pace of the tokens still to come); `now_s`: a wall-clock engine's time of asking
        (default: the clock's last output)."""
        if not self._first:
            return None
        now_ms = (self.clock_s if now_s is None else max(self.clock_s, now_s)) * 1000.0
        after, most = self._after, self._max
        least = None  # the first smallest, as min() keeps (every heartbeat asks: a loop, no generator)
        for rid, (t0, slo) in self._first.items():
            g = after[rid]
            v = saved_slack_ms(g, now_ms - t0 * 1000.0, slo, most[rid] - 2 - g, decode_ms)
            if least is None or v < least:
                least = v
        return least


FREE_PREFILL_MS_PER_TOKEN = 1e-6
"""What an engine whose prefill takes no time (the `zero` profile) reports: EngineStats reads 0
as "not measured yet", which flow control meets with 2 waiting requests a worker per
heartbeat (a fleet of 2 then refused 487 of 500 requests at 250 req/s). 1 ns a token is no
time on any scale the control plane judges in, and the queue's room formula goes to its limit:
the worker's free KV alone bounds what it is sent."""


def prefill_ms_per_token(prof: LatencyProfile) -> float:
    """Cost per token of a full-budget chunk of a fresh prompt, from the profile's step model
    (FREE_PREFILL_MS_PER_TOKEN at least: this is a measurement, never "unknown")."""
    n = prof.max_num_batched_tokens
    return max(prof.step_s(0, 0, [(n, 0)]) * 1000.0 / n, FREE_PREFILL_MS_PER_TOKEN)
