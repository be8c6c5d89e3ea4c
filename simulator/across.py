"""Folding across ticks: one engine's pure decode steps from its STEP_DONE to just before the
next look that reads what its steps deliver, crossing the 100 ms ticks in between.

A tick looks at every engine, but while the queue is empty and no arrival, DISPATCH,
KV_ARRIVE or PROVISION is due before the horizon H (the next arrival), a tick reads an
engine only through its stats (the heartbeat, the batch-size sample) and places nothing on
it: dispatch finds nothing to route (only an arrival fills the queue), and without a
macro-instance controller no phase or control changes the engine. Of those ticks, only
the ones that read the stats need them (`Ticks`): with silent ticks (tick.py) the
last before H and the sampling ones; every tick without. So the fold goes on past each
tick (T_(i+1) = T_i + heartbeat_s, the tick's own sum), in pieces, one per tick L_i that
reads the stats:

    piece i = SimEngineCore.fold(t, until=L_i, late_before=H)
        its steps up to the one across L_i, taken whatever finished or was evicted before
        L_i, where that step ends before H; the engine is then as one by one at L_i (the step
        across L_i has started): its stats there are `engine.stats()`, kept as the instance's
        stats at L_i (SimInstance.stats_at), which the tick at L_i reads instead of the
        engine's own, further on by then (a silent tick crossed keeps None: it reads nothing)
    the fold ends where a piece stops before its tick (the batch emptied, blocks ran short,
    or the step across would end at or after H), where no tick is left before H, or
    where the engine is no longer purely decoding

and its one STEP_DONE, before H, delivers every piece's tokens (token j of a request at the
end of the fold's step j: nobody joins a fold, so each request decodes from its first step
to its finish), finishes and KV events, later than one by one but before anything reads them:
the worker's streams and the router's index are read only by a placement, and none happens
before H. The first piece may instead cross its tick as an ordinary fold does (straddle:
nothing delivered before L_1), and then ends the fold, even past H.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.seq import StepResult

if TYPE_CHECKING:
    from tokenyard.simulator.fleet import SimInstance


class Ticks:
    """The ticks from `first` before `horizon` (each tick_s after the last, summed as the loop
    sums them), each with whether it reads an engine's stats: with silent ticks (`quiet`,
    tick.py), only the last before the horizon and those that sample the batch sizes (each
    sample_s after the last sample, as tick.sample goes); every tick otherwise. Listed as far
    as asked (the horizon may be infinite: no arrival is left, and no tick is silent)."""

    __slots__ = ("horizon", "tick_s", "quiet", "last_sample", "sample_s", "listed", "next_t")

    def __init__(self, first: float, horizon: float, tick_s: float, quiet: bool, last_sample: float | None,
                 sample_s: float):
        self.horizon, self.tick_s, self.sample_s = horizon, tick_s, sample_s
        self.quiet = quiet and horizon < math.inf  # (no arrival left: no tick is silent)
        self.last_sample = last_sample
        self.listed: list[tuple[float, bool]] = []
        self.next_t = first

    def get(self, i: int) -> tuple[float, bool] | None:
        """The i-th tick (time, reads its stats); None: it is not before the horizon."""
        listed = self.listed
        while len(listed) <= i:
            t = self.next_t
            if t >= self.horizon:
                return None
            after = self.next_t = t + self.tick_s
            reads = not self.quiet or after >= self.horizon  # (tick.silent: `now + heartbeat_s < next arrival`)
            last = self.last_sample
            if last is None or t - last >= self.sample_s - 1e-9:
                reads, self.last_sample = True, t
            listed.append((t, reads))
        return listed[i]


def fold_across(inst: SimInstance, now: float, ticks: Ticks, horizon: float) -> StepResult | None:
    """Inst's engine's pure decode steps from `now`, across `ticks` (the ticks before
    `horizon`, each with whether it reads the stats), as one result (None: the next step is
    not a pure decode step). A piece ends only at a tick that reads the stats; those are kept
    on `inst` (SimInstance.ahead), None for the ticks crossed that read nothing."""
    engine, ahead = inst.engine, inst.ahead
    pieces: list[StepResult] = []
    t, i = now, 0
    while (tick := ticks.get(i)) is not None:
        k = i
        while not tick[1]:  # (the last tick before the horizon reads)
            k += 1
            tick = ticks.get(k)
        look = tick[0]
        res = engine.fold(t, look, straddle=not pieces, late_before=horizon)
        if res is None:
            break
        pieces.append(res)
        for d in res.step_durations:  # the times as the loop adds them (a fold lists every step)
            t += d
        if t < look or t >= horizon:  # stopped before its look; or crossed it as a plain fold
            break
        stats = engine.stats()  # at each tick the last step started before: the step across it
        while (tick := ticks.get(i)) is not None and tick[0] <= t:
            ahead.append((tick[0], stats if i >= k else None))
            i += 1
    if len(pieces) <= 1:
        return pieces[0] if pieces else None
    return merged(pieces)


def merged(pieces: list[StepResult]) -> StepResult:
    """Consecutive folds as one: each request's tokens joined (it decoded in every piece up to
    its finish), the steps' durations in order."""
    outs: dict[str, EngineOutput] = {out.request_id: out for out in pieces[0].outputs}  # (the folds' own: fresh)
    durations: list[float] = list(pieces[0].step_durations)
    total = 0.0
    tokens, steps = pieces[0].scheduled_tokens, pieces[0].num_steps
    for res in pieces[1:]:
        for out in res.outputs:
            prev = outs[out.request_id]  # it ran in every piece before
            prev.new_token_ids.extend(out.new_token_ids)
            prev.finished, prev.finish_reason = out.finished, out.finish_reason
        durations.extend(res.step_durations)
        tokens += res.scheduled_tokens
        steps += res.num_steps
    for d in durations:
        total += d
    return StepResult(total, list(outs.values()), tokens, steps, durations)
