"""What requests a `bench serve` run sends, and when: the bench face of the workload registry
(loadgen.workloads.WORKLOADS, the names sim and tune accept too).

A workload here is anything with a `name` and a `requests()` iterator of `BenchRequest`s, each
carrying its prompt (text, or block hashes + length for a trace replay), `max_tokens`,
priority class and arrival offset. `make_workload(config)` picks one by `--workload`:

* `synthetic` (vllm's random dataset): the lengths, classes and arrivals of
  loadgen.workloads.uniform.draw, and prompt_i = input_len_i random ASCII letters/spaces, so
  its length under the built-in byte tokenizer (1 ASCII char = 1 token) is exactly
  input_len_i; max_tokens = output_len_i with ignore_eos, so the engine generates exactly that
  many;
* every other name: the block-id workload, its prompt text synthesised per block id
  (`BlockBenchWorkload`), so equal ids give identical text.

With `--tpot-slo-mix`, every request also carries a `tpot_slo_ms` (`with_tpot_slos`): request
i's is the SLO whose cumulative share first exceeds u_i, u_i the i-th uniform of a generator of
its own (SeedSequence(seed) spawned with a fixed key), so the other draws do not change, the
same seed gives the same SLOs on every workload, and the first k of N are the first k of any run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.workloads import (
    WORKLOADS,
    BlockText,
    is_trace,
    open_workload,
    trace_rate,
    workload_help,
)
from tokenyard.loadgen.workloads.uniform import draw, length_bounds

__all__ = ["BenchRequest", "BlockBenchWorkload", "SyntheticWorkload", "Workload", "length_bounds", "make_workload"]

_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    index: int
    """Position in the run, 0-based."""
    prompt: str | None
    """Prompt text; None for a trace replay that sends block hashes only."""
    prompt_len: int
    """Prompt length in tokens, as the workload counts it."""
    max_tokens: int
    priority: int = 1
    """Declared class 0 (P0) … 3 (P3)."""
    arrival_s: float = 0.0
    """Offset from the run's start at which the request is sent."""
    block_hashes: tuple[int, ...] | None = None
    ignore_eos: bool = True
    tpot_slo_ms: float | None = None
    """The TPOT SLO the request sends (`--tpot-slo-mix`); None sends none (the fleet's default)."""


class Workload(Protocol):
    name: str

    def requests(self) -> Iterator[BenchRequest]: ...


class SyntheticWorkload:
    name = "synthetic"

    def __init__(
        self,
        num_prompts: int,
        input_len: int,
        output_len: int,
        range_ratio: float = 0.0,
        priority_mix: tuple[float, ...] = (0.0, 1.0, 0.0, 0.0),
        rate: float = math.inf,
        burstiness: float = 1.0,
        seed: int = 0,
    ):
        self.num_prompts = num_prompts
        self.input_len = input_len
        self.output_len = output_len
        self.range_ratio = range_ratio
        self.priority_mix = np.asarray(priority_mix, dtype=float) / float(sum(priority_mix))
        self.rate = rate
        self.burstiness = burstiness
        self.seed = seed

    def requests(self) -> Iterator[BenchRequest]:
        n = self.num_prompts
        d = draw(n, self.input_len, self.output_len, self.range_ratio, self.priority_mix, self.rate,
                 self.burstiness, self.seed)
        input_lens, output_lens, priorities, arrivals = d.input_lens, d.output_lens, d.priorities, d.arrivals
        text = _ALPHABET[d.prompt_rng.integers(0, len(_ALPHABET), size=int(input_lens.sum()))].tobytes()
        start = 0
        for i in range(n):
            end = start + int(input_lens[i])
            yield BenchRequest(
                index=i,
                prompt=text[start:end].decode("ascii"),
                prompt_len=int(input_lens[i]),
                max_tokens=int(output_lens[i]),
                priority=int(priorities[i]),
                arrival_s=float(arrivals[i]),
            )
            start = end


class BlockBenchWorkload:
    """A block-id workload as `bench serve` requests: prompt text synthesised per block id
    (BlockText), max_tokens with ignore_eos, declared priority, arrival offset."""

    def __init__(self, inner, seed: int = 0):
        self.inner = inner
        self.name = inner.name
        self.text = BlockText(inner.block_tokens, seed)

    def requests(self) -> Iterator[BenchRequest]:
        for r in self.inner.items():
            yield BenchRequest(
                index=r.index,
                prompt=self.text.prompt(r.block_ids, r.prompt_len),
                prompt_len=r.prompt_len,
                max_tokens=r.max_tokens,
                priority=r.priority,
                arrival_s=r.arrival_s,
            )


_TPOT_SLO_STREAM = 0x7907
"""Spawn key of the TPOT-SLO generator: a stream no other draw of the workload uses."""


class TpotSloWorkload:
    """`inner`'s requests, each with a `tpot_slo_ms` drawn from `mix` ((ms, share) pairs)."""

    def __init__(self, inner: Workload, mix: tuple[tuple[float, float], ...], seed: int = 0):
        self.inner = inner
        self.name = inner.name
        self.slos = np.array([ms for ms, _ in mix], dtype=float)
        shares = np.array([f for _, f in mix], dtype=float)
        self.cumulative = np.cumsum(shares / shares.sum())
        self.seed = seed

    def requests(self) -> Iterator[BenchRequest]:
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(_TPOT_SLO_STREAM,)))
        last = len(self.slos) - 1
        for r in self.inner.requests():
            k = min(int(np.searchsorted(self.cumulative, rng.random(), side="right")), last)
            yield dataclasses.replace(r, tpot_slo_ms=float(self.slos[k]))


def with_tpot_slos(workload: Workload, mix: tuple[tuple[float, float], ...], seed: int = 0) -> Workload:
    """`workload` as is without a mix, else every request with a drawn `tpot_slo_ms`."""
    return TpotSloWorkload(workload, mix, seed) if mix else workload


def make_workload(config: BenchConfig) -> Workload:
    """The workload `--workload` names, with `--tpot-slo-mix`'s per-request TPOT SLOs."""
    return with_tpot_slos(_base_workload(config), config.tpot_slo_mix, config.seed)


def _base_workload(config: BenchConfig) -> Workload:
    """The workload `--workload` names. `--rate` is a generated workload's base rate (inf: all
    at once for `synthetic`, the workload's DEFAULT_RATE for the others: a conversation needs
    its pacing); a trace replays at its own rate, scaled to `--rate` when one is given;
    `--num-prompts` takes that many requests (the first of a trace)."""
    name = config.workload.partition(":")[0]
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {config.workload!r} (known: {workload_help()})")
    if name == "synthetic":
        if config.workload != name:
            raise ValueError("the synthetic workload takes no argument")
        return SyntheticWorkload(
            num_prompts=config.num_prompts,
            input_len=config.input_len,
            output_len=config.output_len,
            range_ratio=config.range_ratio,
            priority_mix=config.priority_mix,
            rate=config.rate,
            burstiness=config.burstiness,
            seed=config.seed,
        )
    rate = None if math.isinf(config.rate) else config.rate
    kw = dict(num_requests=config.num_prompts, priority_mix=config.priority_mix, seed=config.seed)
    if is_trace(config.workload):
        inner = open_workload(config.workload, **kw)
        own = trace_rate(inner.items())
        if rate is not None and math.isfinite(own):  # a trace sent all at once stays so
            inner = open_workload(config.workload, rate_scale=rate / own, **kw)
    else:
        inner = open_workload(config.workload, rate=rate, burstiness=config.burstiness, **kw)
    return BlockBenchWorkload(inner, seed=config.seed)
