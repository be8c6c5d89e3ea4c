"""Workloads as chains of block ids (blocks.py), and the one registry of workload names that
`tokenyard sim`, `tokenyard tune` and `tokenyard bench serve` all read:

    synthetic      vLLM's random dataset: fixed lengths ± a range, no shared prefixes (uniform.py)
    heavy-tail     prompt lengths from 16 to 32k tokens, log-uniform in 4 buckets (heavy_tail.py)
    chatbot, api, coder   multi-turn chat, short prompts on shared system prompts, long shared
                   repository contexts (synthetic.py)
    mooncake, azure-code, azure-conv   the public traces shipped in data/traces (traces.py)
    azure-code-prefix, azure-conv-prefix   the Azure traces with a seeded prefix model
                   (azure_prefix.py: Zipf-popular shared prefixes, session continuations)
    trace:PATH     any Mooncake JSONL or Azure 2023 CSV file (or the same .gz)

    open_workload(spec, …) → a workload with name, block_tokens, items() → list[TraceRequest]

The simulator maps block ids to chain hashes; `bench serve` turns them into text
(loadgen/workload.py), except `synthetic`, which it sends as vLLM's random letters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenyard.loadgen.workloads.blocks import BlockText, PrefixIds, TraceRequest, prefix_hit_bound
from tokenyard.loadgen.workloads.heavy_tail import HeavyTailWorkload
from tokenyard.loadgen.workloads.synthetic import ApiWorkload, ChatBotWorkload, CoderWorkload
from tokenyard.loadgen.workloads.traces import (
    BUNDLED,
    AzureTrace,
    MooncakeTrace,
    open_bundled,
    open_trace,
    trace_rate,
)
from tokenyard.loadgen.workloads.uniform import UniformWorkload

__all__ = [
    "WORKLOADS",
    "ApiWorkload",
    "AzureTrace",
    "BlockText",
    "ChatBotWorkload",
    "CoderWorkload",
    "HeavyTailWorkload",
    "MooncakeTrace",
    "PrefixIds",
    "TraceRequest",
    "UniformWorkload",
    "is_trace",
    "open_workload",
    "prefix_hit_bound",
    "trace_rate",
    "workload_help",
]


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    what: str
    """One line for --help."""
    generated: type | None = None
    """The generator class; None for a trace (replayed at its own rate)."""


WORKLOADS: dict[str, WorkloadKind] = {
    k.name: k
    for k in (
        WorkloadKind("synthetic", "vLLM's random dataset: --input-len/--output-len tokens, no shared prefixes",
                     UniformWorkload),
        WorkloadKind("heavy-tail", "prompts of 16 to 32k tokens, log-uniform in four buckets", HeavyTailWorkload),
        WorkloadKind("chatbot", "multi-turn conversations: each turn extends the last", ChatBotWorkload),
        WorkloadKind("api", "short requests on a few shared system prompts", ApiWorkload),
        WorkloadKind("coder", "long shared repository contexts, short questions", CoderWorkload),
        *(WorkloadKind(name, what) for name, (_, what) in BUNDLED.items()),
        WorkloadKind("trace", "trace:PATH — a Mooncake .jsonl or Azure 2023 .csv file (or .gz)"),
    )
}
"""Every workload name, one registry: sim, tune and bench serve accept exactly these."""


def workload_help() -> str:
    """The names as a --help line."""
    return " | ".join(n if n != "trace" else "trace:PATH" for n in WORKLOADS)


def is_trace(spec: str) -> bool:
    """Whether `spec` names a trace (it has its own rate; scale it instead of setting one)."""
    kind = WORKLOADS.get(spec.partition(":")[0])
    return kind is not None and kind.generated is None


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
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    skip_requests: int = 0,
):
    """The workload `spec` names (see WORKLOADS). For a trace, `num_requests` takes a prefix of
    it (None: all), after its first `skip_requests`, and `rate` must be None (the trace has its
    own; scale it). A generated workload makes `num_requests` requests (1000 if None) at `rate`
    (its DEFAULT_RATE if None), then drops arrivals at or after `duration_s`. `input_len`,
    `output_len` and `range_ratio` shape `synthetic` only."""
    name, _, arg = spec.partition(":")
    kind = WORKLOADS.get(name)
    if kind is None or (arg and name != "trace"):
        raise ValueError(f"unknown workload {spec!r} (known: {workload_help()})")
    if kind.generated is None:
        if name == "trace" and not arg:
            raise ValueError("trace workloads are named trace:PATH")
        if rate is not None:
            raise ValueError("a trace replays at its own rate: scale it with rate_scale / time_scale")
        return (open_trace if name == "trace" else open_bundled)(
            arg if name == "trace" else name,
            rate_scale=rate_scale,
            time_scale=time_scale,
            max_requests=num_requests,
            duration_s=duration_s,
            priority_mix=tuple(priority_mix),
            seed=seed,
            skip_requests=skip_requests,
        )
    if skip_requests:
        raise ValueError("skip_requests applies to traces only (a synthetic workload has no order to skip)")
    shape = dict(input_len=input_len, output_len=output_len, range_ratio=range_ratio) if name == "synthetic" else {}
    return kind.generated(
        1000 if num_requests is None else num_requests,
        rate=rate,
        burstiness=burstiness,
        rate_scale=rate_scale,
        time_scale=time_scale,
        priority_mix=priority_mix,
        seed=seed,
        duration_s=duration_s,
        **shape,
    )
