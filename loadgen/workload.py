"""Workloads: what requests a run sends, and when.

A workload is anything with a `name` and a `requests()` iterator of `BenchRequest`s, each
carrying its prompt (text, or block hashes + length for a trace replay), `max_tokens`,
priority class and arrival offset. `make_workload(config)` picks one by `--workload`:
`synthetic` below, or chatbot / api / coder / trace:PATH from loadgen.workloads.

`synthetic` (vllm's random dataset): for request i

    input_len_i  ~ U{⌊L_in·(1−r)⌋ … ⌈L_in·(1+r)⌉}     (at least 1)
    output_len_i ~ U{⌊L_out·(1−r)⌋ … ⌈L_out·(1+r)⌉}   (at least 1)
    priority_i   ~ Categorical(priority_mix)            (P0..P3)
    prompt_i     = input_len_i random ASCII letters/spaces

so its length under the built-in byte tokenizer (1 ASCII char = 1 token) is exactly
input_len_i; max_tokens = output_len_i with ignore_eos, so the engine generates exactly that
many. Input lengths, output lengths, prompts, priorities and arrivals each draw from their
own child of SeedSequence(seed): changing the rate does not change the prompts, and the
first k requests of a run of N are the first k of any longer run with the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tokenyard.loadgen.arrivals import arrival_offsets
from tokenyard.loadgen.config import BenchConfig

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


class Workload(Protocol):
    name: str

    def requests(self) -> Iterator[BenchRequest]: ...


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive [low, high] of a drawn length (vllm's random dataset), low at least 1."""
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return low, high


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
        in_rng, out_rng, prompt_rng, prio_rng, arrival_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(5)
        )
        in_lo, in_hi = length_bounds(self.input_len, self.range_ratio)
        out_lo, out_hi = length_bounds(self.output_len, self.range_ratio)
        input_lens = in_rng.integers(in_lo, in_hi + 1, size=n)
        output_lens = out_rng.integers(out_lo, out_hi + 1, size=n)
        priorities = prio_rng.choice(4, size=n, p=self.priority_mix)
        arrivals = arrival_offsets(n, self.rate, self.burstiness, arrival_rng)
        text = _ALPHABET[prompt_rng.integers(0, len(_ALPHABET), size=int(input_lens.sum()))].tobytes()
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


def _synthetic(config: BenchConfig, arg: str) -> Workload:
    if arg:
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


def _block_workload(name: str) -> Callable[[BenchConfig, str], Workload]:
    """chatbot / api / coder / trace:PATH (loadgen.workloads), prompt text synthesised per
    block id so equal ids give identical token blocks. `--rate` is the synthetic workload's
    base rate (inf: its DEFAULT_RATE, not all at once: a conversation needs its pacing);
    a trace replays at its own rate, scaled to `--rate` when one is given; `--num-prompts`
    takes that many requests (the first of a trace)."""

    def factory(config: BenchConfig, arg: str) -> Workload:
        from tokenyard.loadgen.workloads import BlockBenchWorkload, open_workload, trace_rate

        spec = f"{name}:{arg}" if name == "trace" else (name + (f":{arg}" if arg else ""))
        rate = None if math.isinf(config.rate) else config.rate
        kw = dict(num_requests=config.num_prompts, priority_mix=config.priority_mix, seed=config.seed)
        if name == "trace":
            inner = open_workload(spec, **kw)
            own = trace_rate(inner.items())
            if rate is not None and math.isfinite(own):  # a trace sent all at once stays so
                inner = open_workload(spec, rate_scale=rate / own, **kw)
        else:
            inner = open_workload(spec, rate=rate, burstiness=config.burstiness, **kw)
        return BlockBenchWorkload(inner, seed=config.seed)

    return factory


WORKLOADS: dict[str, Callable[[BenchConfig, str], Workload]] = {
    "synthetic": _synthetic,
    **{n: _block_workload(n) for n in ("chatbot", "api", "coder", "trace")},
}
"""name → factory(config, argument after `name:`)."""

PLANNED_WORKLOADS: tuple[str, ...] = ()


def make_workload(config: BenchConfig) -> Workload:
    name, _, arg = config.workload.partition(":")
    factory = WORKLOADS.get(name)
    if factory is None:
        available = ", ".join(sorted(WORKLOADS))
        if name in PLANNED_WORKLOADS:
            raise ValueError(f"workload {name!r} is not implemented yet (available: {available})")
        raise ValueError(f"unknown workload {config.workload!r} (available: {available})")
    return factory(config, arg)
