"""The synthetic workload and the arrival process: same seed, same run; lengths where they
should be; exact values for fixed seeds (a change of them is a change of every benchmark)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.arrivals import arrival_offsets
from tokenyard.loadgen.config import BenchConfig, parse_goodput, parse_priority_mix
from tokenyard.loadgen.workload import SyntheticWorkload, length_bounds, make_workload
from tokenyard.shared.tokenizer import ByteTokenizer


def synthetic(**kw) -> list:
    args = dict(num_prompts=200, input_len=64, output_len=16, range_ratio=0.25, seed=3)
    return list(SyntheticWorkload(**{**args, **kw}).requests())


def test_same_seed_same_requests_other_seed_other_requests():
    a, b = synthetic(), synthetic()
    assert a == b
    assert [r.prompt for r in synthetic(seed=4)] != [r.prompt for r in a]


def test_prompts_do_not_depend_on_the_rate():
    slow, fast = synthetic(rate=10.0), synthetic(rate=math.inf)
    assert [(r.prompt, r.max_tokens) for r in slow] == [(r.prompt, r.max_tokens) for r in fast]
    assert all(r.arrival_s == 0.0 for r in fast)


def test_lengths_in_range_and_prompt_token_length_exact():
    tok = ByteTokenizer()
    reqs = synthetic(num_prompts=500)
    assert length_bounds(64, 0.25) == (48, 80) and length_bounds(16, 0.25) == (12, 20)
    assert {r.prompt_len for r in reqs} <= set(range(48, 81))
    assert {r.max_tokens for r in reqs} <= set(range(12, 21))
    assert min(r.prompt_len for r in reqs) == 48 and max(r.prompt_len for r in reqs) == 80  # both ends drawn
    for r in reqs:
        assert len(tok.encode(r.prompt)) == r.prompt_len
        assert r.ignore_eos and r.priority == 1
    assert [r.index for r in reqs] == list(range(500))


@settings(max_examples=50, deadline=None)
@given(
    input_len=st.integers(1, 300),
    output_len=st.integers(1, 50),
    ratio=st.floats(0, 0.99),
    seed=st.integers(0, 2**32),
)
def test_lengths_property(input_len, output_len, ratio, seed):
    lo, hi = length_bounds(input_len, ratio)
    olo, ohi = length_bounds(output_len, ratio)
    for r in synthetic(
        num_prompts=20, input_len=input_len, output_len=output_len, range_ratio=ratio, seed=seed
    ):
        assert lo <= r.prompt_len <= hi and len(r.prompt.encode()) == r.prompt_len
        assert olo <= r.max_tokens <= ohi and r.max_tokens >= 1


def test_zero_range_ratio_gives_exact_lengths():
    assert {(r.prompt_len, r.max_tokens) for r in synthetic(range_ratio=0.0)} == {(64, 16)}


def test_priority_mix_fixed_seed():
    reqs = synthetic(num_prompts=1000, priority_mix=(0.1, 0.6, 0.3, 0.0))
    counts = np.bincount([r.priority for r in reqs], minlength=4).tolist()
    assert counts == [96, 575, 329, 0]
    assert {r.priority for r in synthetic(priority_mix=(0, 0, 0, 2))} == {3}


def test_first_requests_fixed_seed():
    reqs = list(SyntheticWorkload(3, 10, 4, 0.5, (0.25, 0.25, 0.25, 0.25), rate=10, seed=0).requests())
    assert [(r.prompt, r.max_tokens, r.priority) for r in reqs] == [
        ("rwmc qgsng nt", 5, 1),
        ("rzzvjshtarjbwcz", 5, 2),
        ("ytfhe", 3, 1),
    ]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.11237279321607359, 0.30292995602657236])


def test_a_short_run_is_a_prefix_of_a_longer_one():
    mix = (0.1, 0.6, 0.3, 0.0)
    assert (
        synthetic(num_prompts=20, rate=5.0, priority_mix=mix)
        == synthetic(num_prompts=50, rate=5.0, priority_mix=mix)[:20]
    )


def test_poisson_arrivals_fixed_seed():
    rng = np.random.default_rng(0)
    assert arrival_offsets(5, 10.0, 1.0, rng).tolist() == pytest.approx(
        [0.0, 0.06799319039689096, 0.16995290054347745, 0.17193356680238298, 0.1721604994705058]
    )
    # 100 000 gaps at 100 req/s: the mean gap is 1/rate to within 3 standard errors
    # (σ/√n = 0.01/316 ≈ 3.2e-5); the value itself is fixed by the seed.
    offsets = arrival_offsets(100_001, 100.0, 1.0, np.random.default_rng(0))
    mean_gap = offsets[-1] / 100_000
    assert mean_gap == pytest.approx(0.009972351398239177, rel=1e-12)
    assert abs(mean_gap - 0.01) < 1e-4
    assert np.all(np.diff(offsets) >= 0)


def test_burstiness_keeps_the_mean_and_changes_the_spread():
    smooth = np.diff(arrival_offsets(50_001, 100.0, 4.0, np.random.default_rng(1)))
    bursty = np.diff(arrival_offsets(50_001, 100.0, 0.25, np.random.default_rng(1)))
    # Gamma(k, 1/(rate·k)): mean 1/rate; coefficient of variation 1/√k (0.5 and 2)
    assert smooth.mean() == pytest.approx(0.01, rel=0.02) and bursty.mean() == pytest.approx(0.01, rel=0.05)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.05)


def test_infinite_rate_and_empty():
    assert arrival_offsets(3, math.inf, 1.0, np.random.default_rng(0)).tolist() == [0.0, 0.0, 0.0]
    assert arrival_offsets(0, 5.0, 1.0, np.random.default_rng(0)).tolist() == []


def test_make_workload():
    assert make_workload(BenchConfig(workload="synthetic")).name == "synthetic"
    assert make_workload(BenchConfig(workload="chatbot")).name == "chatbot"  # issue 6
    with pytest.raises(ValueError, match="does not exist"):
        make_workload(BenchConfig(workload="trace:/tmp/x.jsonl"))
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload(BenchConfig(workload="nope"))


def test_option_parsing_and_validation():
    assert parse_priority_mix("0.1,0.6,0.3,0") == (0.1, 0.6, 0.3, 0.0)
    for bad in ("1,2,3", "a,b,c,d", "0,0,0,0", "-1,1,1,1"):
        with pytest.raises(ValueError):
            parse_priority_mix(bad)
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:1e4"]) == {
        "ttft": 500.0,
        "tpot": 50.0,
        "e2el": 10000.0,
    }
    for bad in (["ttft"], ["itl:5"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    BenchConfig(target="http://127.0.0.1:8000").validate()
    for bad in (
        dict(range_ratio=1.0), dict(rate=0.0), dict(concurrency=0), dict(input_len=0),
        dict(target="127.0.0.1:4222"), dict(burstiness=0.0), dict(request_timeout_s=0),
    ):  # fmt: skip
        with pytest.raises(ValueError):
            BenchConfig(**bad).validate()
