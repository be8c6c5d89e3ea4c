"""Folding across ticks: one engine's pure decode steps from its STEP_DONE to just before the
next look that reads what its steps deliver, crossing the 100 ms ticks in between.

A tick looks at every engine, but while the queue is empty and no arrival, DISPATCH,
KV_ARRIVE or PROVISION is due before the horizon H (the next arrival), a tick reads an
engine only through its stats (the heartbeat, the batch-size sample) and places nothing on
it: dispatch finds nothing to route (only an arrival fills the queue), and without a
macro-instance controller no phase or control changes the engine. So the fold goes on past
each tick T_i (T_(i+1) = T_i + heartbeat_s, the tick's own sum), in pieces:

    piece i = SimEngineCore.fold(t, until=T_i, late_before=H)
        its steps up to the one across T_i, taken whatever finished or was evicted before
        T_i, where that step ends before H; the engine is then as one by one at T_i (the step
        across T_i has started): its stats there are `engine.stats()`, kept as the instance's
        stats at T_i (SimInstance.stats_at), which the tick at T_i reads instead of the
        engine's own, further on by then
    the fold ends where a piece stops before its tick (the batch emptied, blocks ran short,
    or the step across would end at or after H), where the next tick is not before H, or
    where the engine is no longer purely decoding

and its one STEP_DONE, before H, delivers every piece's tokens (token j of a request at the
end of the fold's step j: nobody joins a fold, so each request decodes from its first step
to its finish), finishes and KV events, later than one by one but before anything reads them:
the worker's streams and the router's index are read only by a placement, and none happens
before H. The first piece may instead cross its tick as an ordinary fold does (straddle:
nothing delivered before T_1), and then ends the fold, even past H.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.seq import StepResult

if TYPE_CHECKING:
    from tokenyard.simulator.fleet import SimInstance


def fold_across(inst: SimInstance, now: float, tick_t: float, horizon: float, tick_s: float) -> StepResult | None:
    """Inst's engine's pure decode steps from `now`, across the ticks tick_t, tick_t + tick_s, …
    before `horizon`, as one result (None: the next step is not a pure decode step); the stats
    at each tick crossed are kept on `inst` (SimInstance.ahead)."""
    engine, ahead = inst.engine, inst.ahead
    pieces: list[StepResult] = []
    t, tick = now, tick_t
    while True:
        res = engine.fold(t, tick, straddle=not pieces, late_before=horizon)
        if res is None:
            break
        pieces.append(res)
        for d in res.step_durations:  # the times as the loop adds them (a fold lists every step)
            t += d
        if t < tick or t >= horizon:  # stopped before the tick; or crossed it as a plain fold
            break
        stats = engine.stats()  # at each tick the last step started before: the step across it
        while tick <= t:
            ahead.append((tick, stats))
            tick += tick_s
        if tick >= horizon:
            break
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
