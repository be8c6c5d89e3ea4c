"""Seed 004's comparison, swept into the short-request flood: bubble queues against SJF and
both fixed-partition baselines (docs/results-bubble.md). Deterministic: the same command
gives the same numbers on any machine (only wall time differs).

    python -m bench.bubble [--instances 8] [--base-rate 16] [--floods 0,40,80,120]
                           [--duration 60] [--long-prefill-token-threshold N]
                           [--out docs/results/bubble.json]

Workload: the heavy-tailed length mix (loadgen/workloads/heavy_tail.py: 45 % < 512 prompt
tokens, 30 % 512–2k, 15 % 2k–8k, 10 % 8k–32k) at `base-rate` req/s, plus `flood` req/s more
of the shortest bucket: the longer requests keep arriving at the same rate while short ones
flood in. `duration` seconds of arrivals, one class (P1), `instances` × a100-llama3-8b.
Short = L < 512, long = L ≥ 8192 (L = prompt + max_tokens). `--long-prefill-token-threshold N`
caps one request's prefill chunk per step in every engine (vLLM's setting; default none).

Policies, all with the fleet's defaults (flow control on, router `marginal-latency`):
  sjf          one queue, shortest first                                   (starves long requests)
  fixed        one queue, round robin over fixed length partitions, work-conserving (registry.py)
  bubble       one queue, bubble queues over the whole fleet              (bubble.py)
  bubble-placed  the same bubble queues, each length range released onto instances of its
               own, split by demand, idle longer ranges lent to shorter ones
               (`--queue-policy bubble-placed`; bubble_placement.py)
  partitioned  the seed's fixed partitions: the instances split by length range, each range's
               requests only to its own instances (bubble_partitions.py; tuning/evaluate.py)
  fcfs         one queue, arrival order
  bubble-count bubble queues with the earlier turn rule (a turn worth the mean waiting length,
               BubbleLine(work_turns=False)), for the comparison
  bubble-r5    bubble queues with round 5's rule: every range its turn each round
               (BubbleLine(yields=False); today's bubble lets a longer range yield its turn
               to shorter ones until its head is overdue), for the comparison
  bubble-o<x>  today's bubble with a head overdue after x (not 2) times its TTFT span, e.g.
               bubble-o1, bubble-oinf: the sensitivity of that constant
Admission's SLO refusals and the queue's deadline rejection are off (tuning/evaluate.py): they
would drop the long requests the study measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench._out import write_result

POLICIES = ("sjf", "fixed", "bubble", "bubble-placed", "partitioned", "fcfs", "bubble-count", "bubble-r5")
DEFAULT_POLICIES = ("sjf", "fixed", "bubble", "bubble-placed", "partitioned")


def make_variant(name: str, **knobs):
    """The registry's policies; `bubble-count`: bubble with BubbleLine(work_turns=False);
    `bubble-r5`: bubble with BubbleLine(yields=False)."""
    from functools import partial

    from tokenyard.services.priority_queue.policies.base import WFQ_WEIGHTS
    from tokenyard.services.priority_queue.policies.bubble import BASE_BOUNDS, BubbleLine
    from tokenyard.services.priority_queue.policies.hybrid import hybrid
    from tokenyard.services.priority_queue.policies.keeps_turn import KeepsTurn
    from tokenyard.services.priority_queue.policies.registry import make_policy

    if name.startswith("bubble-o"):
        line = partial(BubbleLine, knobs["bubble_width"], BASE_BOUNDS, overdue=float(name[len("bubble-o"):]))
    elif name not in ("bubble-count", "bubble-r5"):
        return make_policy(name, **knobs)
    elif name == "bubble-count":
        line = partial(BubbleLine, knobs["bubble_width"], BASE_BOUNDS, True, False, False)
    else:
        line = partial(BubbleLine, knobs["bubble_width"], BASE_BOUNDS, yields=False)
    return KeepsTurn(hybrid(knobs["aging_s"], line, name, WFQ_WEIGHTS))


def _overdue_variant(name: str) -> bool:
    try:
        return name.startswith("bubble-o") and float(name[len("bubble-o"):]) > 0
    except ValueError:
        return False


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def flood_workload(base_rate: float, flood: float, duration_s: float, seed: int = 0):
    """The heavy-tail mix at `base_rate` plus `flood` req/s of its shortest bucket."""
    from tokenyard.loadgen.workloads.heavy_tail import SHARES, HeavyTailWorkload

    rates = [base_rate * s for s in SHARES]
    rates[0] += flood
    total = sum(rates)
    return HeavyTailWorkload(round(total * duration_s), rate=total, seed=seed, shares=rates)


def run_point(instances: int, base_rate: float, flood: float, duration_s: float,
              policies: tuple[str, ...] = DEFAULT_POLICIES, chunk_cap: int | None = None,
              seed: int = 0, refusals: bool = False) -> dict[str, Any]:
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.tuning.evaluate import PartitionedSetup, SimSetup

    w = flood_workload(base_rate, flood, duration_s, seed)
    row: dict[str, Any] = {"flood": flood, "seed": seed, "rate": w.rate, "requests": len(w.items())}
    for pol in policies:
        cfg = SimConfig(instances=instances, long_prefill_token_threshold=chunk_cap)
        t0 = time.perf_counter()
        if pol == "partitioned":
            setup = PartitionedSetup(w, cfg, refusals=refusals)
            row["partition_counts"] = list(setup.partitions().counts)
            m = setup.run()
        else:
            m = SimSetup(w, cfg, pol, make=make_variant, refusals=refusals).run({})
        row[pol] = {"short_p50_ttft_s": m.short_p50_ttft_s, "long_p99_ttft_s": m.long_p99_ttft_s,
                    "long_p50_ttft_s": m.long_p50_ttft_s, "long_mean_ttft_s": m.long_mean_ttft_s,
                    "long_in_60s": m.long_done, "throughput": m.throughput, "completed": m.completed,
                    "failed": m.failed, "short_failed": m.short_failed, "long_failed": m.long_failed,
                    "wall_s": round(time.perf_counter() - t0, 1)}
    for name in ("bubble", "bubble-r5", "bubble-placed"):
        if name not in row:
            continue
        b, tag = row[name], name.replace("-", "_")
        for base in ("partitioned", "fixed"):
            for stat in ("p99", "p50", "mean"):
                if base in row and row[base][f"long_{stat}_ttft_s"] > 0:
                    row[f"long_{stat}_{tag}_over_{base}"] = b[f"long_{stat}_ttft_s"] / row[base][f"long_{stat}_ttft_s"]
        if "sjf" in row and row["sjf"]["short_p50_ttft_s"] > 0:
            row[f"short_p50_{tag}_over_sjf"] = b["short_p50_ttft_s"] / row["sjf"]["short_p50_ttft_s"]
    return row


def where_shorts_wait(instances: int, base_rate: float, flood: float, duration_s: float, policy: str,
                      chunk_cap: int | None = None) -> dict[str, float]:
    """One shared-fleet run (as SimSetup.run, `policy` ordering the queue) that splits the
    short requests' TTFT at the moment their engine takes them: p50 of the wait before it
    (admission → queue → router) and after it (inside the engine, to the first token)."""
    import numpy as np
    from tokenyard.simulator.cluster import ClusterSim, SimConfig
    from tokenyard.tuning.evaluate import policy_knobs

    class Timed(ClusterSim):
        started: dict[str, float]

        def start(self, inst, req, now):
            self.started[req.request_id] = now
            super().start(inst, req, now)

    w = flood_workload(base_rate, flood, duration_s)
    cfg = SimConfig(instances=instances, long_prefill_token_threshold=chunk_cap, slo_check=False, deadline_reject=False)
    sim = Timed(cfg, w.block_tokens)
    sim.started = {}
    sim.queue.policy = make_variant(policy, **policy_knobs({}))
    sim.run(w.items())
    before, inside = [], []
    for rid, st in sim.reqs.items():
        if st.item.prompt_len + st.item.max_tokens < 512 and len(st.tokens) and rid in sim.started:
            before.append(sim.started[rid] - st.item.arrival_s)
            inside.append(st.tokens[0] - sim.started[rid])
    return {"short_p50_before_engine_s": float(np.median(before)), "short_p50_in_engine_s": float(np.median(inside)),
            "short_p90_in_engine_s": float(np.percentile(inside, 90))}


def table(rows: list[dict[str, Any]], policies: tuple[str, ...] = DEFAULT_POLICIES) -> str:
    names = " / ".join(policies)
    bubbles = [b for b in ("bubble", "bubble-r5", "bubble-placed") if b in policies]
    out = [f"| flood (req/s) | seed | total rate | short p50 TTFT (s): {names} | long p99 TTFT (s): {names} "
           f"| req/s done: {names} | refused or expired, short / long: {names} | "
           + " | ".join(f"{b} long p99 ÷ partitioned / short p50 ÷ sjf" for b in bubbles) + " |",
           "|---|---|---|---|---|---|---|" + "---|" * len(bubbles)]

    def col(r: dict[str, Any], key: str, fmt: str) -> str:
        return " / ".join(format(r[p][key], fmt) for p in policies if p in r)

    def ratio(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.2f}" if key in r else "–"

    for r in rows:
        refused = " / ".join(f"{r[p]['short_failed']}+{r[p]['long_failed']}" for p in policies if p in r)
        out.append(f"| {r['flood']:g} | {r.get('seed', 0)} | {r['rate']:.1f} | {col(r, 'short_p50_ttft_s', '.2f')} | "
                   f"{col(r, 'long_p99_ttft_s', '.1f')} | {col(r, 'throughput', '.1f')} | {refused} | "
                   + " | ".join(f"{ratio(r, f'long_p99_{t}_over_partitioned')} / {ratio(r, f'short_p50_{t}_over_sjf')}"
                                for t in (b.replace("-", "_") for b in bubbles)) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bubble", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=8, help="simulated a100-llama3-8b instances (default: %(default)s)")
    p.add_argument("--base-rate", type=float, default=16.0,
                   help="requests a second of the heavy-tailed length mix (default: %(default)s)")
    p.add_argument("--floods", default="0,40,80,120",
                   help="extra short requests a second on top of the mix, comma list, one run each (default: %(default)s)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per run")
    p.add_argument("--seeds", default="0", help="workload seeds, one row per flood and seed")
    p.add_argument("--refusals", action="store_true",
                   help="admission's SLO refusals and the queue's deadline rejection on (a user's "
                        "defaults; off by default, the study's setting); refused counts are reported")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help=f"of {', '.join(POLICIES)}")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None, metavar="N",
                   help="every engine's per-request chunk cap (default: the engines' own, 0: none)")
    p.add_argument("--where", default="", metavar="POLICIES",
                   help="also split the short requests' TTFT before / inside the engine for these shared-fleet policies")
    p.add_argument("--out", default=None, help="write the result as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    policies = tuple(x for x in args.policies.split(",") if x)
    unknown = {x for x in set(policies) - set(POLICIES) if not _overdue_variant(x)}
    if unknown:
        p.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    t0 = time.perf_counter()
    rows = []
    for flood, seed in ((f, int(s)) for f in _floats(args.floods) for s in args.seeds.split(",")):
        rows.append(run_point(args.instances, args.base_rate, flood, args.duration, policies,
                              args.long_prefill_token_threshold, seed, args.refusals))
        for pol in (x for x in args.where.split(",") if x):
            rows[-1].setdefault("where", {})[pol] = where_shorts_wait(
                args.instances, args.base_rate, flood, args.duration, pol, args.long_prefill_token_threshold)
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows, policies))
    write_result(args.out, {"instances": args.instances, "base_rate": args.base_rate, "duration_s": args.duration,
                            "refusals": args.refusals,
                            "long_prefill_token_threshold": args.long_prefill_token_threshold, "rows": rows, "wall_s": time.perf_counter() - t0}, "python -m bench.bubble", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
