"""The scheduling policy seam of the simulated engine: what a step may schedule, in what
order, who joins the running set, and who is preempted. SimEngineCore keeps the mechanics
(token budget, blocks, chunking); a `SchedulingPolicy` makes the choices, so that issue 7
(SCORPIO's VBS admission and credit-based batching, KV regions by priority) and issue 8
(prefill/decode phases) add policies, not branches in the core.

    each step:   batch = policy.step_batch(running)        which running requests run, in order
                 then, if phase allows prefill:
                   while waiting and budget:   seq = waiting.peek()
                       policy.admit(seq, core) → join the running set (else stop: head-of-line)
    out of KV:   victim = policy.victim(candidates)

The default, `VllmPolicy`, is vLLM V1's: every running request each step (decodes and
prefill chunks in running order), waiting requests first come first served, always
admitted while the budget, max_num_seqs and blocks allow; victims: the lowest priority
class first (highest class number), then the one with most generated tokens (DESIGN §3.5),
then the newest (vLLM V1's own choice, `running.pop()`, when all else ties).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from tokenyard.shared.schemas import Phase

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import Seq, SimEngineCore


class WaitingLine(Protocol):
    """Requests not running: new ones at the back, preempted ones at the front."""

    def push(self, seq: Seq) -> None: ...

    def push_front(self, seq: Seq) -> None: ...

    def peek(self) -> Seq: ...

    def pop(self) -> Seq: ...

    def remove(self, seq: Seq) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Seq]: ...


class FcfsLine(deque):
    """First come, first served (vLLM's `fcfs` scheduling policy)."""

    push = deque.append
    push_front = deque.appendleft
    pop = deque.popleft

    def peek(self) -> Seq:
        return self[0]


class SchedulingPolicy(Protocol):
    def new_waiting_line(self) -> WaitingLine: ...

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        """The running requests this step schedules, in order (a subset for credit-based
        batching; `running` itself by default)."""
        ...

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        """May the waiting line's head join the running set now (beyond budget, seats and
        blocks, which the core checks)? False stops admission for this step."""
        ...

    def victim(self, candidates: Sequence[Seq]) -> Seq:
        """The request to preempt when KV blocks run out."""
        ...


class VllmPolicy:
    def new_waiting_line(self) -> WaitingLine:
        return FcfsLine()

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        return running

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        return True

    def victim(self, candidates: Sequence[Seq]) -> Seq:
        return max(candidates, key=lambda s: (s.req.priority, s.generated, s.order))


def allows_prefill(phase: str) -> bool:
    """A worker in its decode phase (EcoServe, issue 8) schedules decodes only: no new
    requests and no prefill chunks; prefill and mixed phases schedule both."""
    return phase != Phase.DECODE
