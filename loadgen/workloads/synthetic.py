"""Synthetic workloads of seed 000's evaluation — ChatBot, API, Coder — as block-id workloads
(block_tokens = 16, vLLM's page size). Every draw comes from its own child of
SeedSequence(seed), so a seed fixes the workload, and the rate (×rate_scale, ÷time_scale)
changes only the arrival times, never the prompts.

Arrivals: gaps ~ Gamma(k = burstiness, θ = 1/(rate·k)) (k = 1: Poisson), offsets scaled by
time_scale / rate_scale. Lengths: L ~ round(LogNormal(ln median, σ)) clipped to [lo, hi].

* ChatBot — multi-turn chat. `users` = ⌈rate · think_s⌉ conversation slots (from the base
  rate, not the scaled one, so scaling keeps the content); arrival i goes to slot
  u ~ U{0…users−1}; if u's conversation has had its T ~ 1 + Geometric(1/mean_turns) turns
  (or would pass max_prompt tokens) a new one starts there. Turn k's prompt is
      system[s] + user_1 + answer_1 + … + answer_{k−1} + user_k
  so each turn extends the previous one by the previous answer and a new user message.
  system[s]: one of 4 prompts, U{200…800} tokens; user ~ LN(120, 0.8) ∈ [8, 2000];
  answer = max_tokens ~ LN(200, 0.7) ∈ [8, 1024].
* API — short prompts sharing a few system prompts: system[s] for s ~ Zipf-like weights
  1/(s+1) over 8 prompts of U{400…2000} tokens, then input ~ LN(80, 0.8) ∈ [4, 1000];
  output ~ LN(60, 0.6) ∈ [4, 512].
* Coder — a long shared repository context and a short question: repo[s] for s with weights
  1/(s+1)^1.1 over 12 contexts of U{3000…12000} tokens; question ~ LN(120, 0.7) ∈ [10, 1500];
  output ~ LN(250, 0.6) ∈ [16, 1024].

Base rates (`DEFAULT_RATE`, requests/s) put a 16-instance A100 Llama-3-8B fleet at a
comfortable load at ×1 (docs/RESULTS.md shows the sweep around it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from tokenyard.loadgen.arrivals import arrival_offsets
from tokenyard.loadgen.workloads.blocks import PrefixIds, TraceRequest


def lognormal_int(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, n: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(math.log(median), sigma, size=n)), lo, hi).astype(np.int64)


class _Synthetic:
    name = "synthetic"
    block_tokens = 16
    DEFAULT_RATE = 1.0

    def __init__(
        self,
        num_requests: int,
        *,
        rate: float | None = None,
        burstiness: float = 1.0,
        rate_scale: float = 1.0,
        time_scale: float = 1.0,
        priority_mix: Sequence[float] = (0.0, 1.0, 0.0, 0.0),
        seed: int = 0,
        duration_s: float | None = None,
    ):
        if num_requests < 0:
            raise ValueError("num_requests must be >= 0")
        if not rate_scale > 0 or not time_scale > 0:
            raise ValueError("rate_scale and time_scale must be positive")
        self.num_requests = num_requests
        self.base_rate = float(rate if rate is not None else self.DEFAULT_RATE)
        if not self.base_rate > 0:
            raise ValueError("rate must be positive")
        self.burstiness = burstiness
        self.factor = time_scale / rate_scale
        self.priority_mix = np.asarray(priority_mix, dtype=float) / float(sum(priority_mix))
        self.seed = seed
        self.duration_s = duration_s
        self._cache: list[TraceRequest] | None = None

    @property
    def rate(self) -> float:
        """The offered rate after scaling."""
        return self.base_rate / self.factor

    def items(self) -> list[TraceRequest]:
        if self._cache is None:
            n = self.num_requests
            arr_rng, prio_rng, body_rng = (
                np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(3)
            )
            arrivals = arrival_offsets(n, self.base_rate, self.burstiness, arr_rng) * self.factor
            prios = prio_rng.choice(4, size=n, p=self.priority_mix)
            ids = PrefixIds(self.block_tokens)
            bodies = self._bodies(n, body_rng)
            self._cache = [
                TraceRequest(i, float(arrivals[i]), sum(x for _, x in segs), out, int(prios[i]), ids.ids(segs))
                for i, (segs, out) in enumerate(bodies)
                if self.duration_s is None or arrivals[i] < self.duration_s
            ]
        return self._cache

    def _bodies(self, n: int, rng: np.random.Generator) -> list[tuple[list[tuple[object, int]], int]]:
        """Each request's prompt segments and max_tokens."""
        raise NotImplementedError


class ChatBotWorkload(_Synthetic):
    name = "chatbot"
    DEFAULT_RATE = 60.0
    SYSTEMS = 4
    MEAN_TURNS = 6.0
    THINK_S = 30.0
    MAX_PROMPT = 16_000

    def _bodies(self, n, rng):
        sys_lens = rng.integers(200, 801, size=self.SYSTEMS)
        users = max(1, math.ceil(self.base_rate * self.THINK_S))
        slot = rng.integers(0, users, size=n)
        user_len = lognormal_int(rng, 120, 0.8, 8, 2000, n)
        answer = lognormal_int(rng, 200, 0.7, 8, 1024, n)
        new_sys = rng.integers(0, self.SYSTEMS, size=n)
        turns = 1 + rng.geometric(1.0 / self.MEAN_TURNS, size=n)
        convs: dict[int, tuple[list, int, int]] = {}  # slot → (segments, turns left, prompt len)
        out = []
        for i in range(n):
            u = int(slot[i])
            segs, left, length = convs.get(u, ([], 0, 0))
            if left <= 0 or length + int(user_len[i]) + int(answer[i]) > self.MAX_PROMPT:
                s = int(new_sys[i])
                segs, left, length = [(("sys", s), int(sys_lens[s]))], int(turns[i]), int(sys_lens[s])
            segs = [*segs, (("user", i), int(user_len[i]))]
            length += int(user_len[i])
            out.append((segs, int(answer[i])))
            # The next turn's prompt carries this turn's answer.
            convs[u] = ([*segs, (("answer", i), int(answer[i]))], left - 1, length + int(answer[i]))
        return out


class ApiWorkload(_Synthetic):
    name = "api"
    DEFAULT_RATE = 250.0
    SYSTEMS = 8

    def _bodies(self, n, rng):
        sys_lens = rng.integers(400, 2001, size=self.SYSTEMS)
        w = 1.0 / np.arange(1, self.SYSTEMS + 1)
        which = rng.choice(self.SYSTEMS, size=n, p=w / w.sum())
        inp = lognormal_int(rng, 80, 0.8, 4, 1000, n)
        outp = lognormal_int(rng, 60, 0.6, 4, 512, n)
        return [
            ([(("sys", int(which[i])), int(sys_lens[which[i]])), (("input", i), int(inp[i]))], int(outp[i]))
            for i in range(n)
        ]


class CoderWorkload(_Synthetic):
    name = "coder"
    DEFAULT_RATE = 30.0
    REPOS = 12

    def _bodies(self, n, rng):
        repo_lens = rng.integers(3000, 12001, size=self.REPOS)
        w = 1.0 / np.arange(1, self.REPOS + 1) ** 1.1
        which = rng.choice(self.REPOS, size=n, p=w / w.sum())
        q = lognormal_int(rng, 120, 0.7, 10, 1500, n)
        outp = lognormal_int(rng, 250, 0.6, 16, 1024, n)
        return [
            ([(("repo", int(which[i])), int(repo_lens[which[i]])), (("question", i), int(q[i]))], int(outp[i]))
            for i in range(n)
        ]


SYNTHETIC = {w.name: w for w in (ChatBotWorkload, ApiWorkload, CoderWorkload)}
