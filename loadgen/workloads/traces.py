"""Readers of public request traces, as block-id workloads. The repository ships three
(data/traces, gzip; sources and licences in its README), named in the workload registry:
`mooncake`, `azure-code`, `azure-conv`; any other file is `trace:PATH` (.jsonl / .csv, or the
same gzip-compressed).

* Mooncake conversation trace (JSONL: `timestamp` ms, `input_length`, `output_length`,
  `hash_ids`): `hash_ids` are 512-token block ids that encode the whole prefix (equal ids =
  shared prefix), so they are the block ids as they stand; block_tokens = 512.
* Azure LLM inference trace 2023 (CSV: `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`): it
  has no prefix information. As `azure-conv` / `azure-code` / `trace:PATH` none is added —
  every request's blocks are its own (prefix_hit_bound = 0); as `azure-conv-prefix` /
  `azure-code-prefix` the seeded prefix model of azure_prefix.py decides which prompts share
  what (Zipf-popular shared prefixes, session continuations). block_tokens = 16, vLLM's page
  size.

Arrival offsets are the trace's own, from its first request, then scaled:
    t_i = (ts_i − ts_0) · time_scale / rate_scale
(rate_scale 2 replays twice as fast; time_scale 2 twice as slow; order is kept). A prefix of
the trace is taken with `max_requests` and/or `duration_s` (arrivals before that offset,
after scaling); `skip_requests` starts it at its N-th request instead of its first (times then
count from there), so one part of a trace can be tuned on and another reported. Priorities,
which neither trace has, are drawn per request from
`priority_mix` with a generator seeded by `seed`.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import msgspec
import numpy as np
from tokenyard.data import TRACES
from tokenyard.loadgen.workloads.azure_prefix import MODELS, PrefixModel, PrefixModeler
from tokenyard.loadgen.workloads.blocks import TraceRequest

BUNDLED: dict[str, tuple[str, str]] = {
    "mooncake": ("mooncake_conversation_trace.jsonl.gz", "Mooncake's conversation trace (FAST'25): shared prefixes, long prompts"),
    "azure-code": ("azure2023_code.csv.gz", "Azure's 2023 code-completion trace: bursty, long prompts, short answers"),
    "azure-conv": ("azure2023_conv.csv.gz", "Azure's 2023 conversation trace: shorter prompts, longer answers"),
    "azure-code-prefix": ("azure2023_code.csv.gz", "azure-code with a seeded prefix model: shared files, sessions"),
    "azure-conv-prefix": ("azure2023_conv.csv.gz", "azure-conv with a seeded prefix model: system prompts, sessions"),
}
"""Workload name → (file in data/traces, what it is)."""


def _open(path: Path, text: bool):
    """The file, decompressed on the fly when it ends in .gz."""
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, newline="") if text else raw


class _MooncakeRow(msgspec.Struct):
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def _priorities(n: int, mix: tuple[float, ...], seed: int) -> np.ndarray:
    p = np.asarray(mix, dtype=float) / float(sum(mix))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x707269]))
    return rng.choice(4, size=n, p=p)


class _TraceWorkload:
    name = "trace"
    block_tokens = 16

    def __init__(
        self,
        path: str | Path,
        *,
        rate_scale: float = 1.0,
        time_scale: float = 1.0,
        max_requests: int | None = None,
        duration_s: float | None = None,
        priority_mix: tuple[float, ...] = (0.0, 1.0, 0.0, 0.0),
        seed: int = 0,
        skip_requests: int = 0,
    ):
        if not rate_scale > 0 or not time_scale > 0:
            raise ValueError("rate_scale and time_scale must be positive")
        if skip_requests < 0:
            raise ValueError("skip_requests must be >= 0")
        self.skip_requests = skip_requests
        self.path = Path(path)
        self.factor = time_scale / rate_scale
        self.max_requests = max_requests
        self.duration_s = duration_s
        self.priority_mix = priority_mix
        self.seed = seed
        self._cache: list[TraceRequest] | None = None

    def _rows(self) -> Iterator[tuple[float, int, int, tuple[int, ...]]]:
        raise NotImplementedError

    def items(self) -> list[TraceRequest]:
        if self._cache is None:
            rows: list[tuple[float, int, int, tuple[int, ...]]] = []
            t0 = None
            for k, (ts, prompt_len, out_len, ids) in enumerate(self._rows()):
                if k < self.skip_requests:
                    continue
                if self.max_requests is not None and len(rows) >= self.max_requests:
                    break
                t0 = ts if t0 is None else t0
                t = (ts - t0) * self.factor
                if self.duration_s is not None and t >= self.duration_s:
                    break
                rows.append((t, prompt_len, out_len, ids))
            prio = _priorities(len(rows), self.priority_mix, self.seed)
            self._cache = [
                TraceRequest(i, t, p, max(1, o), int(prio[i]), ids) for i, (t, p, o, ids) in enumerate(rows)
            ]
        return self._cache


class MooncakeTrace(_TraceWorkload):
    """Mooncake's FAST'25 traces (JSONL, timestamps in ms, 512-token hash_ids)."""

    name = "mooncake"
    block_tokens = 512

    def _rows(self):
        decoder = msgspec.json.Decoder(_MooncakeRow)
        with _open(self.path, text=False) as f:
            for line in f:
                if not line.strip():
                    continue
                row = decoder.decode(line)
                if len(row.hash_ids) * self.block_tokens < row.input_length:
                    raise ValueError(f"{self.path}: {len(row.hash_ids)} hash_ids cannot cover {row.input_length} tokens")
                yield row.timestamp / 1000.0, row.input_length, row.output_length, tuple(row.hash_ids)


class AzureTrace(_TraceWorkload):
    """Azure LLM inference trace 2023 (CSV). `prefix_model` None: no prefix information, none
    added; a PrefixModel: which prompts share what, drawn by it (azure_prefix.py) with `seed`."""

    name = "azure"
    block_tokens = 16

    def __init__(self, path: str | Path, *, prefix_model: PrefixModel | None = None, **kw):
        super().__init__(path, **kw)
        self.prefix_model = prefix_model

    def _rows(self):
        next_id = 0
        modeler = None if self.prefix_model is None else PrefixModeler(self.prefix_model, self.block_tokens, self.seed)
        with _open(self.path, text=True) as f:
            for row in csv.DictReader(f):
                # Timestamps carry 7 fractional digits; datetime takes at most 6.
                ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
                n, out = int(row["ContextTokens"]), int(row["GeneratedTokens"])
                if modeler is not None:
                    yield ts, n, out, modeler.ids(n, out)
                    continue
                blocks = -(-n // self.block_tokens)
                yield ts, n, out, tuple(range(next_id, next_id + blocks))
                next_id += blocks


def open_trace(path: str | Path, **kw) -> _TraceWorkload:
    """A trace reader chosen by the file: `.jsonl` → Mooncake, `.csv` → Azure (either may end
    in `.gz`)."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"trace file {str(p)!r} does not exist")
    kind = p.with_suffix("").suffix if p.suffix == ".gz" else p.suffix
    if kind == ".jsonl":
        return MooncakeTrace(p, **kw)
    if kind == ".csv":
        return AzureTrace(p, **kw)
    raise ValueError(f"unknown trace format {p.suffix!r}: .jsonl (Mooncake) or .csv (Azure 2023), or either .gz")


def open_bundled(name: str, **kw) -> _TraceWorkload:
    """A named trace (BUNDLED); the `-prefix` names with their prefix model (azure_prefix.py)."""
    if name.endswith("-prefix"):
        return AzureTrace(bundled_trace(name), prefix_model=MODELS[name.removeprefix("azure-").removesuffix("-prefix")], **kw)
    return open_trace(bundled_trace(name), **kw)


def bundled_trace(name: str) -> Path:
    """The shipped file of a named trace (`mooncake`, `azure-code`, `azure-conv`)."""
    return TRACES / BUNDLED[name][0]


def trace_rate(items: list[TraceRequest]) -> float:
    """Mean arrival rate of a trace prefix (requests / span of arrivals)."""
    if len(items) < 2:
        return math.inf
    span = items[-1].arrival_s - items[0].arrival_s
    return (len(items) - 1) / span if span > 0 else math.inf
