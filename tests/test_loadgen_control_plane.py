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


def test_the_added_ttft_is_held_to_the_goal_on_each_path_where_measured():
    """With an engine-alone run on a path (NATS: offered to a worker; HTTP: the worker's own
    front) the goal is on the added p50, not the full TTFT; without one, the full TTFT."""
    ttft = {"nats": {"failed": 0, "p50_ttft_ms": 3.0, "p99_ttft_ms": 5.0},
            "http": {"failed": 0, "p50_ttft_ms": 3.7, "p99_ttft_ms": 6.0}}
    both = {"ttft": ttft, "sustained_rate": None, "added": {"p50_ms": 1.8}, "http_added": {"p50_ms": 2.1}}
    got = {v["what"]: (v["measured"], v["met"]) for v in verdicts(both)}
    assert got == {"nats TTFT added p50 (ms)": (1.8, True), "nats TTFT p99 (ms)": (5.0, True),
                   "http TTFT added p50 (ms)": (2.1, False), "http TTFT p99 (ms)": (6.0, True)}
    nats_only = {**both, "http_added": None}  # a running fleet: its workers' fronts unknown
    got = {v["what"]: (v["measured"], v["met"]) for v in verdicts(nats_only)}
    assert got["http TTFT p50 (ms)"] == (3.7, False) and "http TTFT added p50 (ms)" not in got


def test_added_is_the_difference_of_the_medians_and_the_median_of_the_pairs():
    from bench.hop_profile import Sent, added

    ms = 1_000_000
    full = [Sent(0, 0, 3 * ms), Sent(0, 0, 4 * ms), Sent(0, 0, 10 * ms), Sent(0, 0, 0)]  # the last: no token
    alone = [Sent(0, 0, 1 * ms), Sent(0, 0, 3 * ms), Sent(0, 0, 2 * ms), Sent(0, 0, 1 * ms)]
    assert added(full, alone) == {"p50_ms": 4.0 - 1.5, "paired_p50_ms": 2.0, "engine_p50_ms": 1.5}
    assert added([Sent(0, 0, 0)] * 4, alone) == {}  # no full-path token: nothing to say


def test_default_steps():
    args = parse_args([])
    assert args.rates == [250.0, 500.0, 1000.0, 1500.0, 2000.0] and args.workers == 2


def test_hop_profile_cuts_a_trace_into_segments_that_sum_to_the_ttft():
    from bench.hop_profile import HTTP_SEGMENTS, NATS_SEGMENTS, Sent, Span, segments

    ms = 1_000_000
    spans = [  # one request's spans as the receiver keeps them (ns since an arbitrary origin)
        Span("edge", "publish llm.v1.submit", 2 * ms, 30 * ms, {}),
        Span("admission", "process llm.v1.submit", 3 * ms, 9 * ms, {"tokenyard.enqueue_ns": 4 * ms}),
        Span("queue", "process llm.v1.queue", 7 * ms, 12 * ms, {"tokenyard.received_ns": 6 * ms}),
        Span("queue", "send llm.v1.route", 7 * ms, 12 * ms, {}),
        Span("router", "process llm.v1.route", 8 * ms, 11 * ms, {}),
        Span("router", "send llm.v1.worker.w0.generate", 9 * ms, 11 * ms, {}),
        Span("worker", "process llm.v1.worker.w0.generate", 10 * ms, 14 * ms,
             {"tokenyard.received_ns": 9.5 * ms, "tokenyard.first_event_ns": 11 * ms}),
    ]
    http = segments(spans, Sent(1, 0, 13 * ms), http=True)
    assert list(http) == list(HTTP_SEGMENTS)
    # admission's span ends (JetStream's ack, then `accepted`) after the queue has the message:
    # the cut is the publish, not the span's end
    assert http == {"client → edge": 2.0, "edge → admission": 1.0, "admission": 1.0, "JetStream → queue": 2.0,
                    "queue": 1.0, "queue → router": 1.0, "router": 1.0, "router → worker": 0.5, "worker": 1.5,
                    "worker → client": 2.0}
    assert sum(http.values()) == 13.0  # the client's TTFT
    nats = segments(spans[1:], Sent(1, 1 * ms, 13 * ms), http=False)
    assert list(nats) == list(NATS_SEGMENTS) and nats["client → admission"] == 2.0 and sum(nats.values()) == 12.0
    assert segments(spans[:-1], Sent(1, 0, 13 * ms), http=True) is None  # no worker span: not counted
    unnoted = [*spans[:2], Span("queue", "process llm.v1.queue", 7 * ms, 12 * ms, {}), *spans[3:]]
    assert segments(unnoted, Sent(1, 0, 13 * ms), http=True) is None  # an older service's spans: not counted
