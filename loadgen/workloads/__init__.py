"""Workloads as chains of block ids (blocks.py): trace readers (traces.py: Mooncake JSONL,
Azure 2023 CSV) and seed 000's synthetic ChatBot / API / Coder generators (synthetic.py).
The same objects feed the cluster simulator (`tokenyard sim`, block ids → chain hashes) and
`tokenyard bench serve` against a live fleet (block ids → text, `BlockBenchWorkload`).

    open_workload("chatbot" | "api" | "coder" | "trace:PATH", …) → a workload with
        name, block_tokens, items() → list[TraceRequest]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tokenyard.loadgen.workloads.blocks import BlockText, PrefixIds, TraceRequest, prefix_hit_bound
from tokenyard.loadgen.workloads.synthetic import SYNTHETIC, ApiWorkload, ChatBotWorkload, CoderWorkload
from tokenyard.loadgen.workloads.traces import AzureTrace, MooncakeTrace, open_trace, trace_rate

__all__ = [
    "ApiWorkload",
    "AzureTrace",
    "BlockBenchWorkload",
    "BlockText",
    "ChatBotWorkload",
    "CoderWorkload",
    "MooncakeTrace",
    "PrefixIds",
    "TraceRequest",
    "open_workload",
    "prefix_hit_bound",
    "trace_rate",
]

WORKLOAD_NAMES = (*SYNTHETIC, "trace")


def open_workload(
    spec: str,
    *,
    num_requests: int | None = None,
    rate: float | None = None,
    burstiness: float = 1.0,
    rate_scale: float = 1.0,
    time_scale: float = 1.0,
    priority_mix: Sequence[float] = (0.0, 1.0, 0.0, 0.0),
    seed: int = 0,
    duration_s: float | None = None,
    skip_requests: int = 0,
):
    """The workload `spec` names. For a trace, `num_requests` takes a prefix of it (None: all),
    after its first `skip_requests`, and `rate` must be None (the trace has its own; scale it). A synthetic workload makes
    `num_requests` requests (1000 if None) at `rate` (its DEFAULT_RATE if None), then drops
    arrivals at or after `duration_s`."""
    name, _, arg = spec.partition(":")
    if name == "trace":
        if not arg:
            raise ValueError("trace workloads are named trace:PATH")
        if rate is not None:
            raise ValueError("a trace replays at its own rate: scale it with rate_scale / time_scale")
        return open_trace(
            arg,
            rate_scale=rate_scale,
            time_scale=time_scale,
            max_requests=num_requests,
            duration_s=duration_s,
            priority_mix=tuple(priority_mix),
            seed=seed,
            skip_requests=skip_requests,
        )
    cls = SYNTHETIC.get(name)
    if cls is None or arg:
        raise ValueError(f"unknown workload {spec!r} (known: {', '.join(SYNTHETIC)}, trace:PATH)")
    if skip_requests:
        raise ValueError("skip_requests applies to traces only (a synthetic workload has no order to skip)")
    return cls(
        1000 if num_requests is None else num_requests,
        rate=rate,
        burstiness=burstiness,
        rate_scale=rate_scale,
        time_scale=time_scale,
        priority_mix=priority_mix,
        seed=seed,
        duration_s=duration_s,
    )


class BlockBenchWorkload:
    """A block-id workload as `bench serve` requests: prompt text synthesised per block id
    (BlockText), max_tokens with ignore_eos, declared priority, arrival offset."""

    def __init__(self, inner, seed: int = 0):
        self.inner = inner
        self.name = inner.name
        self.text = BlockText(inner.block_tokens, seed)

    def requests(self) -> Iterator:
        from tokenyard.loadgen.workload import BenchRequest

        for r in self.inner.items():
            yield BenchRequest(
                index=r.index,
                prompt=self.text.prompt(r.block_ids, r.prompt_len),
                prompt_len=r.prompt_len,
                max_tokens=r.max_tokens,
                priority=r.priority,
                arrival_s=r.arrival_s,
            )
