"""One request inside the simulated engine (`Seq`), what a step hands back (`StepResult`),
and the tokens a simulated request outputs.

A request's state moves along one axis, `computed` tokens of KV against a `target`:

    waiting ──admit──> running: prefill chunks until computed = target, then one token a step
       ^                  │         (computed = prompt + generated − 1 while decoding)
       └── preempted ─────┘   recompute: its blocks freed, target = prompt + generated, computed = 0
                              swap: its KV parked in the host tier, resumes where it stopped

Output tokens are filler text, deterministic per request: token k of request r is byte
(len(r) + k) mod 45 of FILLER ("the quick brown fox …"), so a run is the same on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenyard.services.worker.engine import EngineOutput
from tokenyard.shared.schemas import AdmittedRequest

FILLER = b"the quick brown fox jumps over the lazy dog. "
_NF = len(FILLER)
_FILLER_LONG = FILLER * 64
_LONG = len(_FILLER_LONG) - _NF


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def filler_token(seq: Seq, pos: int) -> int:
    """The token `seq` outputs at position `pos` of its output."""
    return FILLER[(seq._tok + pos) % _NF]


def filler_tokens(seq: Seq, pos: int, k: int) -> list[int]:
    """Its tokens at positions pos … pos + k − 1 (one slice where it can)."""
    start = (seq._tok + pos) % _NF
    if k <= _LONG:
        return list(_FILLER_LONG[start : start + k])
    return [FILLER[(start + p) % _NF] for p in range(k)]


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "req", "rid", "order", "target", "computed", "generated", "cached", "private",
        "cached_tokens", "started", "running", "swapped", "_tok", "plen", "max_tokens", "remote",
    )

    def __init__(self, req: AdmittedRequest, order: int):
        self.req = req
        self.rid = req.request_id
        self.order = order
        """Arrival order in this engine (the waiting line's tiebreak; the latest is preempted first)."""
        self.target = req.prompt_len
        """Tokens to compute before decoding: the prompt, plus generated ones after a recompute."""
        self.computed = 0
        """Tokens whose KV is in (GPU, or the host tier while swapped)."""
        self.generated = 0
        self.cached: list[int] = []
        """Chain hashes this request holds a reference on (prefix hit, then committed blocks)."""
        self.private = 0
        self.cached_tokens = 0
        """Prompt tokens its first schedule found cached (vLLM's num_cached_tokens: a re-prefill
        after a preemption does not change it)."""
        self.started = False
        self.running = False
        self.swapped = 0
        """Blocks it parked in the host tier (swap preemption); 0 when not swapped."""
        self._tok = len(self.rid)
        self.plen = req.prompt_len
        self.max_tokens = req.max_tokens
        self.remote = False
        """Its prompt's KV was computed on another instance (spatial P/D): it waits for
        blocks to land in, then decodes."""

    @property
    def blocks(self) -> int:
        return len(self.cached) + self.private

    def __repr__(self) -> str:
        return f"Seq({self.rid!r}, computed={self.computed}/{self.target}, generated={self.generated})"


@dataclass
class StepResult:
    duration_s: float
    outputs: list[EngineOutput]
    """Tokens this step produced and requests it finished, delivered at now + duration."""
    scheduled_tokens: int = 0
    num_steps: int = 1
    """Engine steps this result covers (`advance` folds identical decode steps into one)."""
    step_durations: list[float] = field(default_factory=list)
    """With num_steps > 1: each step's duration; token k of every output came at the end of step k."""
