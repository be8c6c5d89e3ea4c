"""A prefix model for the Azure 2023 traces, which record only lengths (issue 12's reported
workloads `azure-conv-prefix`, `azure-code-prefix`). The trace's own arrival times, prompt
lengths L and output lengths stay as they are; only *which* tokens the prompts share is
modelled, seeded, so that a router's cache affinity has something to find:

* K shared prefixes (system prompts / repository files), prefix k of S_k ~ U{s_lo … s_hi}
  tokens, popular by Zipf: P(k) ∝ 1 / (k + 1)^a.
* Sessions. A request continues a session with probability p_cont: the session is drawn
  uniformly among the W most recently active ones whose context (last prompt + its answer)
  is shorter than L; its prompt is that whole context followed by L − context new tokens
  (the next turn of a conversation, or the next completion in the same file). Otherwise —
  or when no recent session is short enough — it opens a new session: prefix k (cut to
  L − 1 tokens if the prompt is shorter) followed by its own tokens.
* Everything else is the request's own: no two requests share a token they were not given
  by the rules above.

Parameters per trace (`MODELS`), chosen from the traces' published descriptions, not tuned
against any router: conversations (Splitwise's `conv`: chat, median prompt 1,020 tokens) have
16 system prompts of 200–1,000 tokens and continue a session half the time; code completion
(`code`: median prompt 1,469 tokens, short answers) has 32 shared file contexts of
500–4,000 tokens and continues a session a third of the time. Zipf a = 1, W = 64 for both.
The draws come from SeedSequence([seed, 0x617a]), so a seed fixes the prompts, and scaling
the rate changes only the arrival times.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from tokenyard.loadgen.workloads.blocks import PrefixIds


@dataclass(frozen=True)
class PrefixModel:
    prefixes: int
    """K: shared prefixes (system prompts, repository files)."""
    prefix_lo: int
    prefix_hi: int
    """S_k ~ U{prefix_lo … prefix_hi} tokens."""
    zipf_a: float
    """Popularity of prefix k ∝ 1 / (k + 1)^zipf_a."""
    p_continue: float
    """Probability that a request continues a recent session."""
    window: int
    """W: sessions recent enough to be continued."""


MODELS = {
    "conv": PrefixModel(prefixes=16, prefix_lo=200, prefix_hi=1000, zipf_a=1.0, p_continue=0.5, window=64),
    "code": PrefixModel(prefixes=32, prefix_lo=500, prefix_hi=4000, zipf_a=1.0, p_continue=1 / 3, window=64),
}


class PrefixModeler:
    """Block ids for one trace's requests, fed in arrival order (module docstring)."""

    def __init__(self, model: PrefixModel, block_tokens: int, seed: int):
        self.model = model
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x617A]))
        self.sizes = self.rng.integers(model.prefix_lo, model.prefix_hi + 1, size=model.prefixes)
        weights = 1.0 / np.arange(1, model.prefixes + 1) ** model.zipf_a
        self.weights = weights / weights.sum()
        self.prefix_ids = PrefixIds(block_tokens)
        self.sessions: OrderedDict[int, tuple[list[tuple[object, int]], int]] = OrderedDict()
        """session id → (its segments so far, its context: last prompt + its answer, tokens)"""
        self.requests = 0

    def ids(self, length: int, answer: int) -> tuple[int, ...]:
        """The block ids of the next request: `length` prompt tokens, `answer` output tokens."""
        m, rng, i = self.model, self.rng, self.requests
        self.requests += 1
        segments: list[tuple[object, int]] | None = None
        sid = i
        if rng.random() < m.p_continue:
            fits = [s for s, (_, ctx) in self.sessions.items() if ctx < length]
            if fits:
                sid = fits[int(rng.integers(len(fits)))]
                prev, ctx = self.sessions.pop(sid)
                segments = [*prev, (("turn", i), length - ctx)]
        if segments is None:
            k = int(rng.choice(m.prefixes, p=self.weights))
            shared = min(int(self.sizes[k]), max(length - 1, 0))
            segments = [(("prefix", k), shared), (("own", i), length - shared)]
        self.sessions[sid] = ([*segments, (("answer", i), answer)], length + answer)
        while len(self.sessions) > m.window:
            self.sessions.popitem(last=False)
        return self.prefix_ids.ids([(key, n) for key, n in segments if n > 0])
