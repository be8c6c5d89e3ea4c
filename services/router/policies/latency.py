"""Marginal latency (the router's default): among the instances whose load is within a bound
relative to the fleet's mean, or beyond it but holding more of r than they have queued
(BoundedLoadGuard and its sticky exemption, below), place r where it adds the least
waiting to the fleet — its own wait for a first token plus the stall its prefill inflicts on
the sequences decoding there — counted in prefill-token times (one unit = the time an
instance takes to prefill one token). No rate, weight or per-workload knob: the one
constant, c = 1.25, is a ratio to the load the fleet itself carries.

    keep_i  = L_i + 1 ≤ ⌈1.25 · (Σ L + 1) / n⌉,  L_i = running + waiting on i   (the guard)
           or (hit_i > Q_i and Q_i + N_i ≤ min over the kept of Q_k + N_k)     (sticky)
    cost_i  = Q_i + N_i + (N_i · B̄ + max(0, N_i − A_i) · B_i) / 2           (the scorer)
    A_i     = max(0, S_i / t_i − Q_i)                                        (decode slack)

For request r and candidate instance i, from i's heartbeat, the router's optimistic additions
and the block index (view.hit → view.new):

    Q_i   queued prefill tokens on i (they run before r: FCFS inside the engine)
    N_i   r's uncached tokens on i = max(len(r) − hit(r, i), 1)
    B_i   sequences on i: running + waiting (+ routed there since its heartbeat)
    B̄     the mean of B over the candidates
    S_i   the TPOT slack of i's tightest running decode (heartbeat, ms: how far ahead of its
          TPOT SLO it runs; none: nothing decodes, A_i = ∞)
    t_i   i's prefill cost per token (heartbeat, ms; 0, not measured yet: A_i = 0);
          S_i / t_i is kept per row at each heartbeat (FleetView.absorb)
    A_i   prefill tokens i's decodes can still take beside them within their TPOT SLO, once
          i's queue has run

    own TTFT      Q_i + N_i                  r waits for i's queue, then its own prefill
    prefill stall (N_i · B̄ + max(0, N_i − A_i) · B_i) / 2
                                             while r's N_i tokens go through (chunked
                                             prefill), every sequence decoding beside them
                                             waits: B_i sequences now, regressing toward the
                                             fleet's mean B̄ by the time r's prefill runs
                                             (after Q_i). The fleet's half, N_i · B̄ / 2, is
                                             what a recomputed token costs wherever r goes
                                             (it keeps affinity under load); i's own half
                                             counts only the tokens i's decodes cannot
                                             absorb within their TPOT SLO (new in round 4):
                                             ahead of their SLO, a chunk beside them costs
                                             them no SLO, while the queue's flow control
                                             holds i's backlog to the same slack
    cost_i        own TTFT + prefill stall; lower is better; ties → lower own TTFT (whole
                  tokens), then, among candidates with nothing queued (Q_i = 0), fewer
                  running sequences R_i (the heartbeat's), then least recently chosen:
                  tie_i = ⌊Q_i + N_i⌋ + [Q_i = 0] · R_i / (max R + 1)   (round 12)

What each term does for the figures (docs/results-routing.md):
* Cache affinity is priced in tokens (N_i), and its weight 1 + (B_i + B̄)/2 grows with the
  fleet's load: under overload every recomputed token stalls more sequences, so affinity
  gets stronger, not weaker (the product's guard threw it away at ×3).
* The stall uses B̄ as well as B_i, so an instance with few sequences but a long queue of
  long prompts does not attract every long prompt (the size-sorting of the bare product
  P × (BS + 1), whose Q·BS term is the stall the queue ahead of r inflicts anyway).
* Nothing depends on r's size but r's own tokens: a long prompt pays for its own prefill
  wherever it goes, it is never deferred for short ones.
* The bound replicates hot prefixes: the cost alone keeps every request for a hot system
  prompt on its holder until the holder's queue outweighs the whole prompt's stall (API's
  hot spot); the bound sends the next one elsewhere as soon as the holder carries more than
  1.25 × the fleet's mean and its queue outgrows the prefix, and that instance then holds a
  copy. Under overload every instance is loaded alike and the bound keeps them all, so
  affinity is not thrown away.
* The sticky exemption keeps a conversation on the instance holding it when that instance
  is a few sequences over a small mean (the lightly loaded fleet, where ⌈1.25 × mean⌉ is a
  tight integer bound) and r would still get its first token there soonest.
* The tie-break on running sequences (round 12) is the decode load where the cost cannot see
  it: while i's decodes run inside their TPOT slack the stall is free, so a fresh prompt
  (no holder, or one every instance holds) ties on every idle-queued instance and went to the
  least recently chosen; it now goes to the one decoding fewest, which spreads the chunked
  prefills that make the TPOT tail. Measured on main a399612 (docs/results-routing.md
  round 12): reported cells won TPOT p99 3 → 9, goodput 5 → 6, TTFT 3 → 3, hit 20 → 20.
* The decode slack prices i's decode load as i's own decodes feel it: a batch whose decodes
  run far ahead of their TPOT SLO takes a long prefill at the price of r's own wait; a
  batch of tight decodes (new ones, or a long context's slow steps) charges r's tokens the
  full stall. Under overload this sends long prompts where their first token comes soonest
  instead of where the batch is smallest (Mooncake's tuning half at ×3: mean TTFT −7 %,
  failed requests 265 → 193, docs/results-routing.md round 4). S_i and t_i are the
  heartbeat's, the figures the queue's flow control and the worker's refusal already use.
Measured and left out (the results document has the numbers): a KV-headroom term pricing
the preemptions to come (it steers away from the instances that hold r's prefix, whose cache
is what fills their KV); a decode term pricing r's own decode time from the heartbeat's
step time (at weight 1 it dwarfs every prompt, and a smaller weight is a knob); the stall at
B_i alone (no B̄); the bound on the measured step time (one step's time, so a prefill chunk
makes a holder look loaded) or also on KV blocks in use (it moves long conversations away
from the instances that hold them); c = 1.5 (worse than 1.25 where measured); a soft price on
KV in use (r's prompt recomputed with the probability u_i that i's KV is full: Mooncake's
TPOT p99 rose 81 → 116 ms at ×1); the sticky exemption also requiring that nothing waits on
i (half the exemption's gain on Mooncake at ×1). Round 4: the whole stall only beyond the
slack (the fleet's half too: hit ratio −0.04 and TPOT p99 +6 ms on ChatBot at ×3); the slack
capped at the queue's ENGINE_BACKLOG_S (worse TTFT at ×3); r's prefill kept off instances
where Q_i + N_i exceeds the flow-control room (worse TTFT at ×3); the bound on KV blocks or
on tokens (context in use + queued) with the exemption; Q_i + N_i alone behind the guard.
Round 5: ties broken toward fewer sequences before recency (better on the tuning workloads;
in the sweep TTFT cells won 4 → 1 and hit 18 → 17 for TPOT p99 7 → 8 and goodput 5 → 10);
the sticky exemption withheld while an instance within the bound is idle, or only while one
was never chosen (either puts ChatBot's three never-used instances to work at ×1; the first
costs Mooncake's conversations, hit 0.182 → 0.147 at ×1, the second Mooncake's TPOT p99 at
×1 and its mean TTFT at ×2 and ×3). Round 6: r's decode priced in the exemption (max_tokens
steps, each B_i + ρ_i·C_i prefill-token times dearer, ρ = the heartbeat's decode cost per
context token ÷ its prefill cost per token, C_i the KV in use; with the fleet's half of r's
recompute) or in the cost: it puts ChatBot's idle instances to work (TPOT p99 18.5 → 16.0 ms
at ×1) but in the sweep took Azure conv's conversations off their holders (hit 0.39 → 0.37,
hit ratio won 18 → 14, TTFT 4 → 3); the slack capped at the queue's budget beside the
fleet's half kept whole (Mooncake's tuning half at ×3: mean TTFT 1,911 → 2,216 ms).
Round 9 (no preemption in any reported cell, so no KV-headroom term): i's absorbed stall priced
while a candidate is idle, beyond the mean batch, or in the sticky exemption (TPOT p99 geomean
−11 to −14 % and 4–9 more goodput cells, but Azure's turns leave their holders: hit cells
won 18 → 7–13); ties toward fewer running sequences where nothing is queued (TPOT p99 won
7 → 9, goodput 5 → 9, but TTFT 4 → 1 on three API margins and hit 18 → 17; shipped in round
12, rerun against the peers under the class cap: TTFT 3 → 3, hit 20 → 20). Round 12: the
absorbed stall priced beyond the fleet's mean batch, min(N, A)·max(0, B_i − B̄)/2, with or
without this tie-break, or the sticky exemption only where r's hit exceeds its whole wait there
(hit > Q + N), or more than it computes (hit ≥ N): better on the tuning workloads (TPOT p99
cells 4 → 9–13 of 20), but Azure's turns leave their holders (reported hit cells 20 → 11–14).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenyard.services.router import kernels
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.router.pipeline import Narrowed, Scored
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class MarginalLatencyScorer:
    name: str = "marginal-latency"
    inputs: frozenset[str] = frozenset()

    def score(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Scored:
        # own = Q + N; stalled = N − A, A = max(0, S/t − Q) (FleetView.absorb = S/t), i.e.
        # Q + N − S/t within [0, N]; cost = own + (N · B̄ + stalled · B) / 2, B̄ over `cand`:
        # one compiled pass over the candidates (services/router/kernels.py, the same IEEE
        # operations as the numpy expressions it replaced)
        cost, tie = kernels.marginal_cost(view.new, view.queued_prefill, view.absorb, view.load, view.running, cand)
        return Scored(cost, tiebreak=tie)


BALANCE_FACTOR = 1.25
"""c of consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018:
c = 1 + ε; ε = 0.25 is the value of its deployments, e.g. HAProxy's `hash-balance-factor
125`). A fixed ratio to the fleet's own mean, not a per-workload threshold."""


def exempt_cost(queued, new):
    """What the sticky exemption compares (BoundedLoadGuard): r's first token on i, Q_i + N_i.
    The reference form: kernels.bounded_load computes it row by row on the hot path (the
    guard's property test checks the guard against this), bench.route_why replays the guard
    from a log with it; arrays or numbers alike. Round 8 measured
    adding the fleet's half of the stall r's uncached tokens inflict, N_i · B̄ / 2 (the
    scorer's price of a recomputed token; bench.routing_ablation's `stickyqm`): level in the
    sweep, better on the live run's simulator twin at ×1 and worse at ×3, mixed on the
    tuning workloads (docs/results-routing.md, round 8), so not the default."""
    return queued + new


@dataclass
class BoundedLoadGuard:
    """Consistent hashing with bounded loads, made relative (SGLang's balance thresholds with
    the fleet mean in place of absolute counts): a candidate may take r only while its load,
    r included, stays within c × the candidates' mean,

        L_i + 1 ≤ ⌈c · (Σ L + 1) / n⌉,      L_i = running + waiting on i (+ routed since)

    so a hot prefix's holders fill up to c × the mean and the next request for it goes to
    another instance, which then holds a copy (a hot prompt is replicated as its load
    demands, instead of queueing behind its first holder). The least loaded candidate always
    passes (its L ≤ ⌊ΣL/n⌋ < (ΣL + 1)/n), so the guard never empties the candidates; when
    every instance is loaded alike (overload) it keeps them all and affinity decides.

    Sticky exemption (llm-d's "sticky until saturated", with saturation read from the
    instance instead of a threshold): an instance beyond the bound still keeps r where r's
    cache there is worth more than the wait,

        hit_i > Q_i   and   Q_i + N_i ≤ min over the kept of (Q_k + N_k)

    — r's cached tokens on i exceed the prefill queued ahead of it there, and r's own first
    token comes no later on i than anywhere within the bound. The bound exists so that a
    holder's queue does not make r wait; where it does not (a conversation's holder a few
    sequences over a small mean, the lightly loaded fleet), sending r away only recomputes
    its context. A holder whose queue outgrows what r has cached there (a hot prefix's
    holder once its queue passes the prefix's length; under overload, holders of all but the
    longest contexts) is not exempt, and the bound replicates and balances as before. Chosen
    on the tuning workloads, where it helped at every load; on the unseen Mooncake half it
    helps at ×1 and costs mean TTFT at ×3 (docs/results-routing.md)."""

    c: float = BALANCE_FACTOR
    sticky: bool = True
    name: str = "bounded-load"
    inputs: frozenset[str] = frozenset()

    def narrow(self, req: AdmittedRequest, view: FleetView, cand: np.ndarray) -> Narrowed:
        # the bound, then the exemption where some candidate beyond it holds more of r than it
        # queues: one compiled pass (services/router/kernels.py)
        keep, sticky = kernels.bounded_load(
            view.load, view.queued_prefill, view.hit, view.new, cand, self.c, self.sticky
        )
        return Narrowed(keep, "sticky" if sticky else "")
