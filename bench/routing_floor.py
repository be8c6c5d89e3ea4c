"""Which reported cells' mean-TTFT figure (≤ 0.9 × the best peer's) no router can reach: the
mean TTFT floor of each workload's requests — each one alone on an idle a100-llama3-8b
instance, with every block any earlier request stored still cached (the infinite cache of
`prefix_hit_bound`) — against 0.9 × the best peer's mean TTFT in the sweep's JSONs.

    python -m bench.routing_floor [--out docs/results/routing]

No placement beats the floor on the simulator's engine: a request's first token comes after
its uncached tokens' prefill, which is fastest alone (a step with more tokens in it takes
longer) and shortest with the most cache, and queueing only adds. It bounds the mean over
every request admitted, so it decides a cell only where all admitted requests were completed
(the metrics are over the completed ones; under overload a policy that fails long prompts is
flattered below the floor), i.e. where the default and the best peer failed only the prompts
the class cap refuses: `out of reach` there when floor > 0.9 × best peer. The class cap
(issue 11, shared.slo.longest_prompt) refuses a P1 prompt whose own prefill on this profile
cannot fit its class's deadline cap, for every policy alike, so those prompts are left out of
the floor (Mooncake's 38 longest of its 1,000 reported; none elsewhere): round 13.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.data import TRACES
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.slack import prefill_ms_per_token
from tokenyard.shared.slo import longest_prompt

from bench.routing_sweep import DEFAULT, LOADS, PEERS, ROOT, WORKLOADS, trace_dir_spec


def class_cap(prof: str = "a100-llama3-8b", priority: int = 1) -> int | None:
    """The longest prompt admission admits at this class on an idle instance of `prof` (its
    heartbeat's prefill costs, as admission reads them); None: no limit."""
    p = profile(prof)
    return longest_prompt(prefill_ms_per_token(p), p.p3 / 2, priority)


def ttft_floor_ms(spec: str, requests: int, skip: int, prof: str = "a100-llama3-8b",
                  longest: int | None = None) -> tuple[float, int]:
    """The mean TTFT floor over the prompts of at most `longest` tokens (None: all), and how
    many longer ones were left out. A prompt left out stores no blocks (it was refused)."""
    p = profile(prof)
    w = open_workload(spec, num_requests=requests, rate_scale=1.0, skip_requests=skip)
    bt, seen, total = w.block_tokens, set(), 0.0
    items = w.items()
    kept = [r for r in items if longest is None or r.prompt_len <= longest]
    for r in kept:
        full = r.prompt_len // bt
        hit = 0
        for bid in r.block_ids[:full]:
            if bid not in seen:
                break
            hit += 1
        cached = min(hit, (r.prompt_len - 1) // bt) * bt  # an engine computes at least one token
        total += p.prefill_s(r.prompt_len - cached, cached)
        seen.update(r.block_ids[:full])
    return total / len(kept) * 1000.0, len(items) - len(kept)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "routing"), help="the sweep's JSONs")
    ap.add_argument("--traces", default=str(TRACES),
                    help="folder holding the traces the reported workloads replay (default: the bundled traces)")
    args = ap.parse_args()
    out = Path(args.out)
    longest = class_cap()
    print("| workload | load | TTFT floor (ms) | refused by the class cap | best peer (ms) | 0.9 × best peer | default "
          "| default ÷ best peer | default and best peer completed all admitted | figure |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name, (spec, _, skip, kind) in WORKLOADS.items():
        if kind != "reported":
            continue
        floor = refused = None
        for load in LOADS:
            path = out / f"{name}_x{load:g}.json"
            if not path.exists():
                continue
            doc = json.loads(path.read_text())
            res = doc["policies"]
            if floor is None:
                floor, refused = ttft_floor_ms(trace_dir_spec(spec, args.traces), doc["config"]["num_requests"], skip,
                                               longest=longest)
            who = min((p for p in PEERS if p in res), key=lambda p: res[p]["mean_ttft_ms"])
            best = res[who]["mean_ttft_ms"]
            complete = res[DEFAULT]["failed"] == refused and res[who]["failed"] == refused
            verdict = "out of reach" if complete and floor > 0.9 * best else "reachable" if complete else "not decided"
            print(f"| {name} | ×{load:g} | {floor:.1f} | {refused} | {best:.1f} | {0.9 * best:.1f} | "
                  f"{res[DEFAULT]['mean_ttft_ms']:.1f} | {res[DEFAULT]['mean_ttft_ms'] / best:.3f} | {'yes' if complete else 'no'} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
