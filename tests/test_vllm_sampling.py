"""The sampling a request carries (schemas.Sampling) as vLLM's SamplingParams: each field given
reaches vLLM as given, and one not given leaves vLLM's default."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from tokenyard.services.worker.vllm.engine import sampling_params  # noqa: E402
from tokenyard.shared import schemas  # noqa: E402
from vllm import SamplingParams  # noqa: E402

from tests import builders  # noqa: E402


def test_penalties_top_k_min_p_and_min_tokens_reach_vllm_as_given():
    given = schemas.Sampling(temperature=0.3, presence_penalty=0.5, frequency_penalty=-1.5, repetition_penalty=1.2,
                             top_k=40, min_p=0.05, min_tokens=4)
    p = sampling_params(builders.req("r1", max_tokens=8, sampling=given))
    assert (p.temperature, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.top_k, p.min_p,
            p.min_tokens, p.max_tokens) == (0.3, 0.5, -1.5, 1.2, 40, 0.05, 4, 8)


def test_none_given_leaves_vllms_defaults():
    p = sampling_params(builders.req("r1", max_tokens=8))
    default = SamplingParams(max_tokens=8)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.top_k, p.min_p, p.min_tokens) == (
        default.presence_penalty, default.frequency_penalty, default.repetition_penalty, default.top_k,
        default.min_p, default.min_tokens)
