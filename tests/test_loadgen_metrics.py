"""Metrics of bench serve on hand-built records: every figure worked out by hand below."""

from __future__ import annotations

import io
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from tokenyard.loadgen.metrics import compute_metrics, pooled_itl, summarise
from tokenyard.loadgen.records import NO_OUTPUT, RequestRecord
from tokenyard.loadgen.report import print_result

approx = pytest.approx


def rec(index, priority, prompt_len, send, chunks, usage=None, error=None) -> RequestRecord:
    r = RequestRecord(
        index=index, priority=priority, prompt_len=prompt_len, send_s=send, chunk_s=list(chunks)
    )
    r.usage_completion_tokens = usage
    r.streamed_tokens = len(chunks)
    if error:
        r.fail(error)
    r.close(send + 10)
    return r


def records() -> list[RequestRecord]:
    return [
        # ttft 100, itl 50 100, e2el 250, tpot (250-100)/2 = 75
        rec(0, 1, 10, 0.0, [0.10, 0.15, 0.25], usage=3),
        # ttft 200, itl 100 ×4, e2el 600, tpot 400/4 = 100
        rec(1, 1, 20, 1.0, [1.2, 1.3, 1.4, 1.5, 1.6], usage=5),
        # one token: ttft 50, e2el 50, no tpot, no itl
        rec(2, 0, 5, 2.0, [2.05], usage=1),
        rec(3, 0, 7, 2.5, [], error="status_429"),
        # timed out after one chunk: a failure, its chunk counts nowhere
        rec(4, 2, 9, 3.0, [3.1], error="timeout"),
    ]


def test_counts_and_throughputs():
    m = compute_metrics(records(), duration_s=4.0)
    assert m["duration"] == 4.0
    assert m["completed"] == 3
    assert m["failed"] == 2
    assert m["total_input_tokens"] == 10 + 20 + 5
    assert m["total_output_tokens"] == 3 + 5 + 1
    assert m["request_throughput"] == approx(0.75)
    assert m["output_throughput"] == approx(9 / 4)
    assert m["total_token_throughput"] == approx(44 / 4)
    assert m["request_goodput"] is None
    assert m["errors"] == {"status_429": 1, "timeout": 1}


def test_latency_stats_match_vllm_definitions():
    m = compute_metrics(records(), duration_s=4.0)
    # TTFT [100, 200, 50]
    assert m["mean_ttft_ms"] == approx(350 / 3)
    assert m["median_ttft_ms"] == approx(100)
    assert m["std_ttft_ms"] == approx((11666.666666666666 / 3) ** 0.5)
    assert m["p90_ttft_ms"] == approx(180)  # sorted 50 100 200, rank 0.9·2 = 1.8
    assert m["p95_ttft_ms"] == approx(190)
    assert m["p99_ttft_ms"] == approx(198)
    # TPOT [75, 100]: only requests with > 1 output token
    assert m["mean_tpot_ms"] == approx(87.5)
    assert m["median_tpot_ms"] == approx(87.5)
    assert m["p99_tpot_ms"] == approx(99.75)
    # ITL pooled [50, 100, 100, 100, 100, 100]
    assert m["mean_itl_ms"] == approx(550 / 6)
    assert m["median_itl_ms"] == approx(100)
    assert m["p99_itl_ms"] == approx(100)
    # E2EL [250, 600, 50]
    assert m["mean_e2el_ms"] == approx(300)
    assert m["median_e2el_ms"] == approx(250)
    assert m["p99_e2el_ms"] == approx(593)


def test_goodput_requires_every_slo():
    # ttft ≤ 150 and tpot ≤ 90: request 0 (100, 75) and request 2 (50, tpot 0) are good; 1 is not
    m = compute_metrics(records(), 4.0, {"ttft": 150, "tpot": 90})
    assert m["request_goodput"] == approx(2 / 4)
    assert compute_metrics(records(), 4.0, {"e2el": 100})["request_goodput"] == approx(1 / 4)
    assert compute_metrics(records(), 4.0, {"ttft": 10})["request_goodput"] == 0.0
    assert m["by_priority"]["P0"]["request_goodput"] == approx(1 / 4)
    assert m["by_priority"]["P1"]["request_goodput"] == approx(1 / 4)
    assert m["by_priority"]["P2"]["request_goodput"] == 0.0


def test_by_priority_blocks():
    m = compute_metrics(records(), 4.0)
    assert list(m["by_priority"]) == ["P0", "P1", "P2"]
    p0, p1, p2 = (m["by_priority"][k] for k in ("P0", "P1", "P2"))
    assert (p0["completed"], p0["failed"], p0["total_output_tokens"]) == (1, 1, 1)
    assert p0["mean_ttft_ms"] == approx(50)
    assert p0["mean_tpot_ms"] == 0.0  # no request of P0 has a TPOT
    assert (p1["completed"], p1["failed"], p1["total_input_tokens"]) == (2, 0, 30)
    assert p1["median_ttft_ms"] == approx(150)
    assert p1["mean_tpot_ms"] == approx(87.5)
    assert p1["p99_e2el_ms"] == approx(250 + 0.99 * 350)
    assert p1["request_throughput"] == approx(0.5)
    assert (p2["completed"], p2["failed"], p2["mean_e2el_ms"]) == (0, 1, 0.0)


def test_output_tokens_fall_back_to_stream_count():
    r = rec(0, 1, 4, 0.0, [0.1, 0.2, 0.3], usage=None)
    m = compute_metrics([r], 1.0)
    assert m["total_output_tokens"] == 3
    assert m["mean_tpot_ms"] == approx(100)


def test_usage_prompt_tokens_win_over_workload_count():
    r = rec(0, 1, 4, 0.0, [0.1], usage=1)
    r.usage_prompt_tokens = 6
    assert compute_metrics([r], 1.0)["total_input_tokens"] == 6


def test_stream_without_chunks_is_a_failure():
    r = rec(0, 1, 4, 0.0, [])
    assert not r.success and r.error == NO_OUTPUT
    assert compute_metrics([r], 1.0)["errors"] == {NO_OUTPUT: 1}


def test_empty_run_is_all_zeros():
    m = compute_metrics([], 0.0, {"ttft": 1})
    assert m["completed"] == m["failed"] == 0
    assert m["request_throughput"] == m["request_goodput"] == 0.0
    assert m["mean_ttft_ms"] == m["p99_e2el_ms"] == 0.0
    assert m["by_priority"] == {} and m["errors"] == {}


def test_summarise_keys():
    assert list(summarise("ttft", [0.001, 0.003])) == [
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
    ]  # fmt: skip
    assert summarise("x", [0.001, 0.003], percentiles=(99.9,))["p99.9_x_ms"] == approx(2.998)


def test_print_result_renders_every_block():
    m = compute_metrics(records(), 4.0, {"ttft": 150})
    out = io.StringIO()
    print_result(m, Console(file=out, width=140))
    text = out.getvalue()
    for needle in ("Serving Benchmark Result", "Successful requests", "Request goodput", "P99 TTFT (ms)",
                   "Inter-token Latency", "By priority class", "status_429"):  # fmt: skip
        assert needle in text


@given(st.lists(st.lists(st.floats(0.0, 1e4, allow_nan=False), max_size=30).map(sorted), max_size=8),
       st.booleans())
def test_the_pooled_itl_is_every_records_gaps_bit_for_bit(chunks, as_array):
    # the simulator's records hold array('d'), the live bench's lists: either, each gap as
    # RequestRecord.itl computes it, in record order
    recs = [RequestRecord(index=i, priority=0, prompt_len=1, chunk_s=array("d", c) if as_array else list(c))
            for i, c in enumerate(chunks)]
    pooled = pooled_itl(recs)
    expected = [gap for r in recs for gap in r.itl]
    assert pooled.tolist() == expected
    assert summarise("itl", pooled) == summarise("itl", expected)


def test_each_failure_reason_keeps_its_first_message():
    """A 503 from admission names the rule that refused it; the result keeps the first message per
    reason, so a run's refusals can be told apart (README's closed loop of 32 lost 93 of 500 to
    503s in a run whose messages were gone)."""
    def refused(index: int, message: str) -> RequestRecord:
        r = RequestRecord(index=index, priority=1, prompt_len=10, send_s=float(index))
        r.fail("status_503", message)
        r.close(index + 0.1)
        return r

    wait = "Fleet saturated: a P1 request faces a predicted wait of 6.10 s against its 5 s TTFT target"
    m = compute_metrics([*records(), refused(5, wait), refused(6, "Fleet saturated: the global budget")], 7.0)
    assert m["errors"] == {"status_429": 1, "status_503": 2, "timeout": 1}
    assert m["error_messages"] == {"status_429": "", "status_503": wait, "timeout": ""}
    assert compute_metrics(records()[:2], 1.0)["error_messages"] == {}
