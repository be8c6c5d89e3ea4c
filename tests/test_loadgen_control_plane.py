"""The control-plane benchmark's bookkeeping (bench/control_plane.py): when a rate step
holds, and which targets are met. The benchmark itself needs a fleet and runs by hand."""

from __future__ import annotations

from bench.control_plane import holds, parse_args, realised_rate, verdicts


def test_realised_rate_and_hold_rule():
    assert realised_rate(1001, 2.0, 400.0) == 500.0
    assert realised_rate(1, 0.0, 400.0) == 400.0
    assert holds(offered=1000.0, achieved=950.0, failed=0)
    assert not holds(offered=1000.0, achieved=949.9, failed=0)
    assert not holds(offered=1000.0, achieved=1000.0, failed=1)


def test_verdicts():
    result = {
        "ttft": {
            "nats": {"failed": 0, "p50_ttft_ms": 1.5, "p99_ttft_ms": 10.0},
            "http": {"failed": 1, "p50_ttft_ms": 1.0, "p99_ttft_ms": 2.0},
        },
        "sustained_rate": 1000.0,
    }
    got = {v["what"]: v["met"] for v in verdicts(result)}
    assert got == {
        "nats TTFT p50 (ms)": True,
        "nats TTFT p99 (ms)": True,
        "http TTFT p50 (ms)": False,  # a failed request voids the latency figures
        "http TTFT p99 (ms)": False,
        "sustained rate (req/s)": True,
    }


def test_default_steps():
    args = parse_args([])
    assert args.rates == [250.0, 500.0, 1000.0, 1500.0, 2000.0] and args.workers == 2
