"""Admission's drain is bounded by what the queue's flow control can release (D_r,
services/admission/wait_terms.py `release_rate`): the queue sends a worker no more prompt
tokens than its room, min(B_w / a_w, kv_free_w), and that room opens again only with the
worker's next heartbeat. On a prefix-cached flash crowd the engines then sit nearly idle (2–5 %
of their token budget) while the queue drains at this rate, far below the engines' D_s."""

from __future__ import annotations

import math

import pytest
from tokenyard.services.admission.feasibility import FleetView
from tokenyard.services.admission.wait_terms import release_rate
from tokenyard.shared.schemas import QueueStats

from tests.builders import hb

A = 0.07459414654245
"""a100-llama3-8b's reported prefill cost per token (ms): a full 2,048-token chunk's step ÷ 2,048."""
NOW = 1.15


def api_burst_fleet(*, flow_control: bool = True) -> FleetView:
    """The fleet state at which `python -m bench.overload overload --workload api --instances 8
    --loads 5` admitted the requests that then expired (t = 1.15 s into its 2 s flash crowd): 8
    A100s each running ~49 decodes in 17 ms steps, their decodes' TPOT slack 1.3 s, 85 % of the
    prompt tokens found cached; the queue holds 1.57M work tokens and measured a drain of 548k
    work tokens a second while the burst's first requests were prefilled; the requests admitted
    lately are 1,604 prompt + 74 output tokens."""
    f = FleetView()
    for i in range(8):
        f.on_heartbeat(hb(f"w{i}", ts=NOW, running=49, free=27_000, block_size=16, step_time_ms=17.0,
                          prefill_ms_per_token=A, prefill_ms_per_token2=2.3252e-06,
                          decode_ms_per_ctx_token=7.858528e-05, tpot_slack_ms=1300.0,
                          prefix_hits=85_000, prefix_queries=100_000, interval_s=0.1), NOW)
    for _ in range(3):
        f.on_admitted(1, 1604 + 74, 1604, NOW - 0.01)
    f.on_queue_stats(QueueStats("pq-1", NOW, "hybrid", [0, 1000, 0, 0], [0, 1_572_888, 0, 0], 0, 548_202.0, 180.0,
                                headroom=0, seen_arrival_s=NOW, flow_control=flow_control), NOW)
    return f


def test_a_flash_crowds_wait_is_priced_at_the_rate_the_queue_can_release_not_at_the_engines():
    """Before: D = min(548k measured, D_s(4.75 s) ≈ 400k), a predicted wait of 4 s, admitted,
    and the request expired 4.75 s later: the queue released 287k–293k work tokens a second from
    t = 2.5 s to the end of the backlog. The queue's room per heartbeat is 8 × 0.25 s ÷ a =
    26,811 prompt tokens (the whole prompt counts, cached or not), ten heartbeats a second:
    268k prompt tokens, 281k work tokens a second. The wait is 5.6 s: refused at the door."""
    f = api_burst_fleet()
    ceiling = 8 * (0.25 * 1000.0 / A) / 0.1 * (1604 + 74) / 1604
    assert f.release_ceiling(NOW) == pytest.approx(ceiling)
    engines = min(548_202.0, f.sustainable_drain(NOW, 4.75))  # what bounded D before: ~397k
    assert engines > 1.4 * ceiling and 1_572_888 / engines + 0.25 < 5.0  # admitted before
    v = f.judge(1, None, NOW)
    assert v.wait_s == pytest.approx(1_572_888 / ceiling)
    assert v.wait_s == pytest.approx(5.61, abs=0.01)
    assert not v.feasible


def test_a_queue_without_flow_control_is_not_bounded_by_its_room():
    """With flow control off the queue releases by slots, not by prompt tokens: no ceiling, the
    wait is the work ahead over min(measured, D_s)."""
    f = api_burst_fleet(flow_control=False)
    drain = min(548_202.0, f.sustainable_drain(NOW, 4.75))
    assert f.judge(1, None, NOW).wait_s == pytest.approx(1_572_888 / drain)


def test_the_release_rate_is_a_workers_whole_room_once_per_heartbeat():
    # prefill budget H = 0.25 s at 0.1 ms a token: 2,500 tokens, ten times a second
    assert release_rate(0.1, 10**6, 0.1) == pytest.approx(25_000)
    assert release_rate(0.1, 800, 0.2) == pytest.approx(4_000)  # free KV bounds the room
    assert release_rate(0.0, 10**6, 0.1) == math.inf  # no prefill cost reported: not counted in tokens


def test_the_ceiling_is_an_upper_bound_the_decodes_slack_does_not_lower():
    """Decodes past their TPOT SLO take no prefill now (the queue's room is 0 there), but their
    slack comes back as they finish: the ceiling counts every worker's whole room."""
    f = api_burst_fleet()
    before = f.release_ceiling(NOW)
    for i in range(8):
        f.on_heartbeat(hb(f"w{i}", ts=NOW, running=49, free=27_000, block_size=16, step_time_ms=17.0,
                          prefill_ms_per_token=A, tpot_slack_ms=-200.0, interval_s=0.1), NOW)
    assert f.release_ceiling(NOW) == pytest.approx(before)


def test_with_no_free_kv_anywhere_the_ceiling_is_unknown_and_the_measured_drain_decides():
    """No room on any worker: when it returns is not known here; not a 0 drain that would
    refuse every request with work ahead."""
    f = api_burst_fleet()
    for i in range(8):
        f.on_heartbeat(hb(f"w{i}", ts=NOW, running=49, free=0, block_size=16, step_time_ms=17.0,
                          prefill_ms_per_token=A, interval_s=0.1), NOW)
    assert f.release_ceiling(NOW) is None
    drain = min(548_202.0, f.sustainable_drain(NOW, 4.75))
    assert f.judge(1, None, NOW).wait_s == pytest.approx(1_572_888 / drain)
