"""One simulated engine alone on a virtual clock, fed requests at their arrival times.

Loop: admit every request that has arrived by `now`; with nothing to do, jump to the next
arrival; else reject what waited past its deadline (`expire(now)`), take one step and advance
`now` by its duration — or, when nothing was schedulable, to the next arrival. Each step is
yielded as (now after it, the requests expired before it, its result)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tokenyard.services.worker.sim.core import SimEngineCore, StepResult
from tokenyard.shared.schemas import AdmittedRequest


def replay(core: SimEngineCore, reqs: Sequence[AdmittedRequest]) -> Iterator[tuple[float, list, StepResult]]:
    """`reqs` in arrival order."""
    now, k = 0.0, 0
    while k < len(reqs) or core.has_work():
        while k < len(reqs) and reqs[k].arrival_s <= now:
            core.add(reqs[k])
            k += 1
        if not core.has_work():
            now = reqs[k].arrival_s
            continue
        expired = core.expire(now)
        res = core.step()
        if res.duration_s <= 0 and not res.outputs:
            now = reqs[k].arrival_s if k < len(reqs) else now  # nothing schedulable: wait for arrivals
            continue
        now += res.duration_s
        yield now, expired, res
