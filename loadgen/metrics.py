"""The result dict of a run, with vllm bench serve's definitions and key names.

Over the successful requests (RequestRecord: ttft, itl, e2el, tpot):

    TTFT  first chunk − send                       per request
    TPOT  (e2el − ttft) / (output_tokens − 1)      per request with > 1 output token
    ITL   gaps between consecutive chunks          pooled over all requests
    E2EL  last chunk − send                        per request

each summarised as mean_/median_/std_/p90_/p95_/p99_<metric>_ms (numpy's mean, median,
population std, linear-interpolated percentile; 0 for an empty set, as vllm).

    completed, failed            successful / failed request counts
    duration                     seconds from the first send to the last request's end
    request_throughput           completed / duration
    output_throughput            Σ output tokens of completed / duration
    total_token_throughput       (Σ input + Σ output tokens of completed) / duration
    request_goodput              good / duration, a request being good if it meets every given
                                 SLO (ttft, tpot, e2el in ms; a request with ≤ 1 output token
                                 has tpot 0, as vllm) — a request that sent its own
                                 `tpot_slo_ms` is judged by that one instead of `tpot`; None
                                 when no SLO was given and no request sent one
    by_priority["P0".."P3"]      the same block over one declared class
    by_tpot_slo["50", …]         the same block over the requests that sent one TPOT SLO (ms;
                                 "none" for those that sent none); only when some sent one
    errors                       failed requests counted by reason label
    error_messages               the first failed request's message per reason label
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenyard.loadgen.records import NO_OUTPUT, RequestRecord

PERCENTILES = (90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def summarise(
    name: str, values_s: Sequence[float], percentiles: Sequence[float] = PERCENTILES
) -> dict[str, float]:
    """mean/median/std/pN of `values_s` (seconds) in ms, keyed as vllm does (`p99_ttft_ms`)."""
    arr = np.asarray(values_s, dtype=float) if len(values_s) else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(arr) * 1000),
        f"median_{name}_ms": float(np.median(arr) * 1000),
        f"std_{name}_ms": float(np.std(arr) * 1000),
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p) * 1000)
    return out


def is_good(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """Meets every SLO given (vllm: `slo >= value`), its own TPOT SLO in place of `tpot`
    where it sent one; only meaningful for a successful record."""
    if record.tpot_slo_ms is not None:
        slos_ms = {**slos_ms, "tpot": record.tpot_slo_ms}
    values_ms = {
        "ttft": record.ttft * 1000,
        "tpot": (record.tpot or 0.0) * 1000,
        "e2el": record.e2el * 1000,
    }
    return all(values_ms[k] <= slo for k, slo in slos_ms.items())


def block(
    records: Sequence[RequestRecord], duration_s: float, goodput_ms: dict[str, float] | None
) -> dict[str, Any]:
    """Counts, throughputs and latency summaries over `records`; goodput unless `goodput_ms`
    is None."""
    ok = [r for r in records if r.success]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    dur = duration_s if duration_s > 0 else float("nan")
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": _rate(len(ok), dur),
        "request_goodput": _rate(sum(is_good(r, goodput_ms) for r in ok), dur) if goodput_ms is not None else None,
        "output_throughput": _rate(total_output, dur),
        "total_token_throughput": _rate(total_input + total_output, dur),
    }
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": pooled_itl(ok),
        "e2el": [r.e2el for r in ok],
    }
    for name in LATENCY_METRICS:
        out.update(summarise(name, series[name]))
    return out


def pooled_itl(records: Sequence[RequestRecord]) -> np.ndarray:
    """Every record's gaps between consecutive chunks (RequestRecord.itl), in record order, as
    one array: numpy's differences are Python's (one IEEE subtraction each), without a Python
    float per gap (a simulation has millions)."""
    parts = [np.diff(np.asarray(r.chunk_s, dtype=float)) for r in records if len(r.chunk_s) > 1]
    return np.concatenate(parts) if parts else np.zeros(0)


def compute_metrics(
    records: Sequence[RequestRecord], duration_s: float, goodput_ms: dict[str, float] | None = None
) -> dict[str, Any]:
    own_slos = sorted({r.tpot_slo_ms for r in records if r.tpot_slo_ms is not None})
    if not goodput_ms:  # no SLO given (None or {}): judge only the requests' own TPOT SLOs, if any
        goodput_ms = {} if own_slos else None
    result: dict[str, Any] = {"duration": duration_s, **block(records, duration_s, goodput_ms)}
    classes = sorted({r.priority for r in records})
    result["by_priority"] = {
        f"P{p}": block([r for r in records if r.priority == p], duration_s, goodput_ms) for p in classes
    }
    if own_slos:
        groups: dict[str, list[RequestRecord]] = {f"{ms:g}": [] for ms in own_slos}
        for r in records:
            groups.setdefault(f"{r.tpot_slo_ms:g}" if r.tpot_slo_ms is not None else "none", []).append(r)
        result["by_tpot_slo"] = {name: block(rs, duration_s, goodput_ms) for name, rs in groups.items()}
    result["errors"] = dict(sorted(Counter(r.error or NO_OUTPUT for r in records if not r.success).items()))
    # The first failure's message per reason: a 503 says which rule refused it (admission's
    # predicted wait and queue depth, the decode room, no live worker, the global budget), which
    # the count alone cannot tell apart.
    result["error_messages"] = {reason: next((r.message for r in records if not r.success
                                              and (r.error or NO_OUTPUT) == reason), "")
                                for reason in result["errors"]}
    return result


def _rate(count: float, duration_s: float) -> float:
    """count / duration, 0 for a zero-length run (nothing can be said about its rate)."""
    value = count / duration_s
    return float(value) if np.isfinite(value) else 0.0
