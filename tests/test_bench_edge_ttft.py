"""bench.edge_ttft's summary: each path's p50 and p99, and what it adds over the HTTP floor —
the difference of the medians, and the median of the per-round differences."""

from __future__ import annotations

from bench.edge_ttft import summarize


def test_added_is_the_difference_of_medians_and_the_median_of_the_pairs():
    ms = 1e-3
    ttft = {
        "http": [1 * ms, 2 * ms, 3 * ms],
        "ref": [3 * ms, 3.5 * ms, 9 * ms],  # per round: +2, +1.5, +6
        "this": [2 * ms, 4 * ms, 3.5 * ms],  # per round: +1, +2, +0.5
        "nats": [1 * ms, 2 * ms, 3 * ms],
    }
    out = summarize(ttft)
    assert out["http"] == {"p50_ms": 2.0, "p99_ms": 3.0}
    assert out["ref"] == {"p50_ms": 3.5, "p99_ms": 9.0, "added_p50_ms": 1.5, "added_paired_ms": 2.0}
    assert out["this"] == {"p50_ms": 3.5, "p99_ms": 4.0, "added_p50_ms": 1.5, "added_paired_ms": 1.0}
    assert out["nats"]["added_p50_ms"] == 0.0 and out["nats"]["added_paired_ms"] == 0.0
