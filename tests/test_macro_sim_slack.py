"""The simulated engine's EcoServe inputs: saved TPOT slack on the engine's clock, and the
prefill cost per token from the latency profile."""

from __future__ import annotations

import pytest
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.slack import SlackClock, prefill_ms_per_token


def tok(rid: str, finished: bool = False) -> EngineOutput:
    return EngineOutput(rid, [7], finished, "length" if finished else None)


def NONE(rid: str) -> float:
    return 0.0


def OWN(rid: str) -> float:
    return 30.0 if rid == "b" else 0.0


def test_slack_is_the_tightest_decode_ahead_of_its_tpot_slo():
    c = SlackClock(default_tpot_slo_ms=50.0)
    assert c.min_slack_ms() is None
    c.on_step(0.2, [tok("a")], NONE)  # a's first token at 0.2 s
    assert c.min_slack_ms() == 50.0  # a whole TPOT SLO before its second token is late
    c.on_step(0.02, [tok("a"), tok("b")], OWN)  # b's first at 0.22 s, its own SLO 30 ms
    # a: 2 × 50 − 20 = 80 ms; b: 1 × 30 − 0 = 30 ms
    assert c.min_slack_ms() == pytest.approx(30.0)
    for _ in range(4):
        c.on_step(0.02, [tok("a"), tok("b")], OWN)
    # a: 6 × 50 − 100 = 200; b: 5 × 30 − 80 = 70
    assert c.min_slack_ms() == pytest.approx(70.0)
    c.on_step(0.5, [tok("a"), tok("b", finished=True)], NONE)  # a long (mixed) step eats a's slack
    # a: 7 × 50 − 600 = −250
    assert c.min_slack_ms() == pytest.approx(-250.0)
    c.forget("a")
    assert c.min_slack_ms() is None


def test_slack_counts_the_tokens_still_to_come_at_the_decode_pace():
    """Issue 13: the mean TPOT is what the SLO scores, so a request with many tokens to come
    at a decode step faster than its SLO can absorb a long prefill now."""
    c = SlackClock(default_tpot_slo_ms=50.0)
    c.on_step(0.2, [tok("a")], NONE, lambda rid: 101)  # 100 tokens after the first
    # (0 + 1 + 99) × 50 − 0 − 99 × 20 = 3020 ms at 20 ms decode steps
    assert c.min_slack_ms(20.0) == pytest.approx(3020.0)
    assert c.min_slack_ms(50.0) == pytest.approx(50.0)  # decoding at the SLO saves nothing
    for _ in range(99):
        c.on_step(0.02, [tok("a")], NONE, lambda rid: 101)
    # its last token is next: 100 × 50 − 99 × 20 = 3020, whatever the pace
    assert c.min_slack_ms(20.0) == c.min_slack_ms(500.0) == pytest.approx(3020.0)


def test_prefill_cost_per_token_is_a_full_chunk_over_its_tokens():
    prof = profile("a100-llama3-8b")
    n = prof.max_num_batched_tokens
    assert prefill_ms_per_token(prof) == pytest.approx(prof.step_s(0, 0, [(n, 0)]) * 1000.0 / n)
    assert 0.05 < prefill_ms_per_token(prof) < 0.1  # ≈ 156 ms for 2k tokens (calibration table)
