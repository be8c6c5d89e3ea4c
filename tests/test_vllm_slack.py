"""A vLLM worker's TPOT slack: the simulated engine's SlackClock run on the wall clock, fed
the tokens the vLLM adapter streams (services/worker/vllm/engine.py), against scripted token
timings; and the tracker carrying it into the heartbeat's EngineStats. The adapter itself, on
a scripted AsyncLLM and on the real engine, is tested in tests/test_vllm_engine.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.slack import SlackClock
from tokenyard.services.worker.vllm.stats import StatsTracker
from tokenyard.shared.ecoserve import saved_slack_ms
from tokenyard.shared.slo import DEFAULT_TPOT_SLO_MS


def seen(clock: SlackClock, t: float, rid: str, n: int = 1, slo_ms: float = 0.0, max_tokens: int = 10,
         finished: bool = False) -> None:
    """What the adapter does with one streamed output of `n` new tokens, seen at wall time t."""
    clock.advance_to(t)
    clock.on_step(0.0, [EngineOutput(rid, [7] * n, finished, "length" if finished else None)],
                  lambda _: slo_ms, lambda _: max_tokens)


def test_a_decode_on_time_keeps_its_slack_and_a_stalled_one_loses_it_as_time_passes():
    c = SlackClock()
    assert c.min_slack_ms(40.0, now_s=1.0) is None  # nothing decodes
    seen(c, 1.00, "a")  # first token at 1.00 s; SLO 100 ms (the default), 10 tokens at most
    seen(c, 1.05, "a")
    seen(c, 1.10, "a")
    # g = 2 after the first, k = 10 − 2 − 2 = 6 still to come after the next at d = 40 ms:
    # (2 + 1 + 6) · 100 − 120 − 6 · 40 = 540 ms, asked at 1.12 s
    assert c.min_slack_ms(40.0, now_s=1.12) == pytest.approx(540.0)
    # no token since 1.10 s (a long prefill chunk stalls it): the wall clock eats the slack
    assert c.min_slack_ms(40.0, now_s=1.50) == pytest.approx(160.0)
    assert c.min_slack_ms(40.0, now_s=1.70) == pytest.approx(-40.0)
    # the clock never runs back: asking at an earlier time counts from the last token seen
    assert c.min_slack_ms(40.0, now_s=1.00) == pytest.approx(900 - 100 - 240)


def test_the_tightest_decode_counts_with_its_own_tpot_slo():
    c = SlackClock()
    seen(c, 2.0, "loose", max_tokens=100)
    seen(c, 2.0, "tight", slo_ms=30.0, max_tokens=4)
    seen(c, 2.03, "tight", slo_ms=30.0, max_tokens=4)
    # loose: (0 + 1 + 98) · 100 − 50 − 98 · 20 = 7,890; tight: (1 + 1 + 1) · 30 − 50 − 1 · 20 = 20
    assert c.min_slack_ms(20.0, now_s=2.05) == pytest.approx(20.0)
    seen(c, 2.06, "tight", slo_ms=30.0, max_tokens=4, finished=True)  # it leaves: the loose one counts
    assert c.min_slack_ms(20.0, now_s=2.06) == pytest.approx(99 * 100 - 60 - 98 * 20)
    c.forget("loose")  # an abort: no finished output of its own
    assert c.min_slack_ms(20.0, now_s=2.06) is None


def test_tokens_delivered_together_count_each():
    c = SlackClock()
    seen(c, 0.0, "a", n=1, max_tokens=50)
    seen(c, 0.3, "a", n=3, max_tokens=50)  # three tokens in one delta (async output batching)
    assert c.min_slack_ms(0.0, now_s=0.3) == pytest.approx((3 + 1 + 45) * DEFAULT_TPOT_SLO_MS - 300)  # k = 50 − 2 − 3


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=30),
       wait=st.floats(min_value=0.0, max_value=2.0), slo=st.sampled_from([0.0, 25.0, 100.0]),
       max_tokens=st.integers(min_value=2, max_value=64), decode_ms=st.floats(min_value=0.0, max_value=80.0))
def test_the_slack_is_saved_slack_of_the_observed_timings(gaps, wait, slo, max_tokens, decode_ms):
    """Whatever the inter-token times: the clock's answer is shared.ecoserve.saved_slack_ms of
    the tokens seen since the first and the time since it, at the time of asking."""
    c, t = SlackClock(), 10.0
    seen(c, t, "r", slo_ms=slo, max_tokens=max_tokens)
    for gap in gaps:
        t += gap
        seen(c, t, "r", slo_ms=slo, max_tokens=max_tokens)
    now = t + wait
    expected = saved_slack_ms(len(gaps), (now - 10.0) * 1000.0, slo or DEFAULT_TPOT_SLO_MS,
                              max_tokens - 2 - len(gaps), decode_ms)
    assert c.min_slack_ms(decode_ms, now_s=now) == pytest.approx(expected, abs=1e-6)


def test_the_heartbeat_carries_the_slack_the_adapter_measured():
    t = StatsTracker(fleet_block_size=16, num_blocks=100, block_size=16)
    assert t.snapshot(open_requests=0, queued_prefill_tokens=0).tpot_slack_ms is None
    assert t.snapshot(open_requests=2, queued_prefill_tokens=0, tpot_slack_ms=-35.0).tpot_slack_ms == -35.0
