"""The scheduling policy seam of the simulated engine: what a step may schedule, in what
order, who joins the running set, and who is preempted. SimEngineCore keeps the mechanics
(token budget, blocks, chunking); a `SchedulingPolicy` makes the choices, so that issue 7
(SCORPIO's VBS admission and credit-based batching, KV regions by priority) and issue 8
(prefill/decode phases) add policies, not branches in the core.

    each step:   budget = min(max_num_batched_tokens, policy.token_budget(core))
                 for v in policy.due_victims(core): core preempts v   (claims decided earlier)
                 batch = policy.step_batch(running)        which running requests run, in order
                 then, if phase allows prefill:
                   while waiting and budget:   seq = waiting.peek()
                       policy.admit(seq, core) → join the running set (else stop: head-of-line)
    out of KV:   victim = preemption_victim(running)
    heartbeat:   policy.heartbeat_fields(core) join the engine's stats
    folding:     policy.folds(running): identical decode steps may be computed as one (fold.py)

The default, `VllmPolicy`, is vLLM V1's with `scheduling_policy="priority"` (what the vLLM
worker sets): every running request each step (decodes and prefill chunks in running order);
the waiting line ordered by (class, arrival), a preempted request going back into it by the
same key; always admitted while the budget, max_num_seqs and blocks allow.

The one preemption rule, every policy's (vLLM V1's priority mode,
`max(running, key=(priority, arrival_time))`):
    victim = the running request of the lowest class (highest class number), then the latest
             arrival in this engine
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from tokenyard.services.worker.sim.ttft_guard import full_step
from tokenyard.shared.schemas import Phase
from tokenyard.shared.slo import klass

if TYPE_CHECKING:
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.seq import Seq


def victim_key(seq: Seq) -> tuple[int, int]:
    """Larger goes first: lower class, then later arrival."""
    return (klass(seq.req.priority), seq.order)


def preemption_victim(candidates: Sequence[Seq]) -> Seq:
    return max(candidates, key=victim_key)


class WaitingLine(Protocol):
    """Requests not running: new ones pushed, preempted ones pushed back (`push_front`)."""

    def push(self, seq: Seq) -> None: ...

    def push_front(self, seq: Seq) -> None: ...

    def peek(self) -> Seq: ...

    def pop(self) -> Seq: ...

    def remove(self, seq: Seq) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Seq]: ...

    def ordered(self) -> list[Seq]:
        """The waiting requests in the order they would be served."""
        ...


class KeyedLine:
    """A waiting line ordered by `key(seq, preempted)` (ties: arrival order in the engine);
    a lazy-deletion heap. With a `gate`, the head is the first of the `lookahead` first
    requests that passes it (else the true head): SCORPIO's admission tries every waiting
    request in deadline order, not only the first. Iteration is in no particular order."""

    def __init__(self, key: Callable[[Seq, bool], tuple], gate: Callable[[Seq], bool] | None = None,
                 lookahead: int = 32) -> None:
        self.key = key
        self.gate = gate
        self.lookahead = lookahead
        self._heap: list[tuple[tuple, int, int, Seq]] = []
        self._live: dict[int, int] = {}
        """id(seq) → the stamp of its live entry."""
        self._stamp = 0

    def __deepcopy__(self, memo: dict) -> KeyedLine:
        """A working copy (a whole engine's, to run it forward from here): `_live` is keyed by
        the requests' ids, which the copy's requests do not share."""
        new = KeyedLine.__new__(KeyedLine)
        memo[id(self)] = new
        new.key, new.gate = copy.deepcopy(self.key, memo), copy.deepcopy(self.gate, memo)
        new.lookahead, new._stamp = self.lookahead, self._stamp
        new._heap = copy.deepcopy(self._heap, memo)
        live = self._live
        new._live = {id(n[3]): n[2] for o, n in zip(self._heap, new._heap, strict=True) if live.get(id(o[3])) == o[2]}
        return new

    def _push(self, seq: Seq, preempted: bool) -> None:
        self._stamp += 1
        self._live[id(seq)] = self._stamp
        heapq.heappush(self._heap, (self.key(seq, preempted), seq.order, self._stamp, seq))

    def push(self, seq: Seq) -> None:
        self._push(seq, False)

    def push_front(self, seq: Seq) -> None:
        self._push(seq, True)

    def _clean(self) -> None:
        heap = self._heap
        while heap and self._live.get(id(heap[0][3])) != heap[0][2]:
            heapq.heappop(heap)

    def peek(self) -> Seq:
        self._clean()
        head = self._heap[0][3]
        if self.gate is None or self.gate(head):
            return head
        for entry in heapq.nsmallest(self.lookahead, self._heap):
            if self._live.get(id(entry[3])) == entry[2] and self.gate(entry[3]):
                return entry[3]
        return head

    def pop(self) -> Seq:
        seq = self.peek()
        del self._live[id(seq)]  # its heap entry is now stale, dropped when it surfaces
        return seq

    def remove(self, seq: Seq) -> None:
        del self._live[id(seq)]

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Seq]:
        live = self._live
        for entry in self._heap:
            if live.get(id(entry[3])) == entry[2]:
                yield entry[3]

    def ordered(self) -> list[Seq]:
        """The waiting requests in the order they would be served (gate aside)."""
        return [e[3] for e in sorted(self._heap, key=lambda e: e[:3]) if self._live.get(id(e[3])) == e[2]]


def priority_key(seq: Seq, preempted: bool) -> tuple[int]:
    """vLLM's priority order: class, then arrival (the line's tiebreak); a preempted request
    keeps its place by the same key."""
    return (klass(seq.req.priority),)


class SchedulingPolicy(Protocol):
    """The seam. `new_waiting_line` and `admit` every policy decides; the rest have defaults
    here (vLLM's behaviour), which a policy inherits by subclassing this Protocol or
    replaces by defining the method (SCORPIO's credit batching, the KV regions' claims).
    The core calls every hook directly: there is no optional method to probe for."""

    rejects_past_deadline: bool = False
    """Whether the engine rejects a waiting request that never started once its first token
    can no longer come by its TTFT deadline (SimEngineCore.expire, ttft_guard.py; SCORPIO's
    rejection path), instead of keeping it."""

    class_ordered: bool = True
    """Whether a step runs the running requests' chunks first, then the waiting line by class
    first (vLLM's priority scheduling, the default), so that a new class-c request waits only
    behind the running prefills and the waiting ones of class ≤ c (EngineStats.
    queued_prefill_ahead). False: it may wait behind any of them (SCORPIO's line by deadline,
    its credit batch a subset of the running)."""

    guards_tpot: bool = False
    """Whether the policy itself keeps every step within its running decodes' TPOT SLOs (SCORPIO's
    token budget). Its engine then reports no TPOT slack (engine_stats.py): a prefill backlog
    there delays no decode past its SLO, so the upstream decode term (the queue's flow control,
    the worker's `saturated` refusal, admission's decode term, shared.slo.prefill_budget_s) has
    nothing to protect — holding prefill upstream would only starve the engine's own guard."""

    def new_waiting_line(self) -> WaitingLine: ...

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        """May the waiting line's head join the running set now (beyond budget, seats and
        blocks, which the core checks)? False stops admission for this step."""
        ...

    def due_victims(self, core: SimEngineCore) -> Sequence[Seq]:
        """Running requests the core preempts before this step's batch is built (a claim an
        earlier `admit` decided: the victims finished their step first). The policy returns
        them; the core preempts (preemption.preempt_due). Default: none."""
        return ()

    def step_batch(self, running: list[Seq]) -> Sequence[Seq]:
        """The running requests this step schedules, in order (a subset for credit-based
        batching). Default: `running` itself, every request every step."""
        return running

    def token_budget(self, core: SimEngineCore) -> int:
        """This step's token cap (the core takes the smaller of it and max_num_batched_tokens).
        Default: max_num_batched_tokens."""
        return core.prof.max_num_batched_tokens

    def folds(self, running: list[Seq]) -> bool:
        """Whether identical decode steps of `running` may be folded into one (fold.py): the
        policy would run the whole batch every step. Asked without side effects. Default:
        `step_batch(running) is running`, which a policy with a stateful `step_batch` replaces."""
        return self.step_batch(running) is running

    def heartbeat_fields(self, core: SimEngineCore) -> dict[str, float]:
        """Extra EngineStats fields the policy reports (SCORPIO's VBS for the router). Default: none."""
        return {}

    def prefill_step(self, core: SimEngineCore, decodes: list[Seq]) -> tuple[int, float]:
        """The TTFT guard's optimistic step beside `decodes` (ttft_guard.py): (prompt tokens it
        prefills, its seconds). Default: vLLM's full step beside every decode."""
        return full_step(core, decodes)


class VllmPolicy(SchedulingPolicy):
    rejects_past_deadline = False

    def new_waiting_line(self) -> WaitingLine:
        return KeyedLine(priority_key)

    def admit(self, seq: Seq, core: SimEngineCore) -> bool:
        return True


def allows_prefill(phase: str) -> bool:
    """A worker in its decode phase (EcoServe, issue 8) schedules decodes only: no new
    requests and no prefill chunks; prefill and mixed phases schedule both."""
    return phase != Phase.DECODE
