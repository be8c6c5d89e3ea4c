"""The live burst's shape (bench.live_burst) in the cluster simulator: the same cores, zero
transport delay, so it separates what admission's prediction decides from what the live
fleet's messaging and a loaded machine add.

    python -m bench.sim_burst [--workers 2] [--rate 115] [--seconds 4] [--input-len 2000]
                              [--output-len 100] [--mix 5,60,30,5] [--seed 0]
                              [--long-prefill-token-threshold N]

Prints when admission first refused (after the first arrival), how many it refused and the
queue expired, and per class: when its first refusal came, how many were refused and expired,
and the served requests' TTFT against the class target (and how many served requests missed
their own deadline, class target + own prefill). The default mix is the design's (5/60/30/5,
as bench.live_burst's); `--mix 0,60,30,10` is the burst of rounds 3-6.

It also prints when the first admitted request that then failed its deadline arrived (served
past it, or expired in the queue): where a forecast that knew the burst's future would have
refused first, the yardstick for admission's first refusal (docs/results-priorities.md).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def admitted_but_failed(states: list, t0: float) -> tuple[int, float | None]:
    """(how many admitted requests then missed their TTFT deadline — served past it, or
    expired in the queue —, the arrival after t0 of the first of them; None: none did).
    Requests without a deadline (P3, ttft_budget_s 0) never count."""
    failed = sorted(st.item.arrival_s - t0 for st in states if st.expired or late(st))
    return len(failed), (failed[0] if failed else None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.sim_burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="simulated a100-llama3-8b workers (default: %(default)s)")
    p.add_argument("--rate", type=float, default=115.0, help="requests/s (live_burst: 10 × the capacity, 11.5)")
    p.add_argument("--seconds", type=float, default=4.0, help="how long the burst lasts, simulated seconds (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=2000, help="prompt tokens of every request (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=100, help="output tokens of every request (default: %(default)s)")
    p.add_argument("--mix", default="5,60,30,5", help="P0,P1,P2,P3 shares (default: the design's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the arrival times, the classes and the prompts' blocks (default: %(default)s)")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None, metavar="N",
                   help="every engine's per-request chunk cap (default: the engines' own, 0: none)")
    return p


def burst(args: argparse.Namespace, prepare=None) -> tuple[list, list]:
    """The burst's requests (seeded) run through the cluster simulator: (items, final states).
    `prepare(sim)`, if given, is called before the run (bench.burst_forecast swaps admission's
    forecast there)."""
    from tokenyard.loadgen.config import parse_priority_mix
    from tokenyard.loadgen.workloads.blocks import TraceRequest
    from tokenyard.simulator.cluster import ClusterSim, SimConfig

    rng = np.random.default_rng(args.seed)
    n = int(args.rate * args.seconds)
    arrivals = np.cumsum(rng.exponential(1 / args.rate, n))
    mix = np.array(parse_priority_mix(args.mix))
    classes = rng.choice(4, size=n, p=mix / mix.sum())
    items = [TraceRequest(i, float(arrivals[i]), args.input_len, args.output_len, int(classes[i]),
                          tuple(int(x) for x in rng.integers(1 << 40, size=args.input_len // 16))) for i in range(n)]
    sim = ClusterSim(SimConfig(instances=args.workers, long_prefill_token_threshold=args.long_prefill_token_threshold), 16)
    if prepare is not None:
        prepare(sim)
    sim.run(items)
    return items, list(sim.reqs.values())


def late(st) -> bool:
    """Served past its own deadline (class target + own prefill; P3 has none)."""
    return bool(st.finished and len(st.tokens) and st.ttft_budget_s > 0
                and st.tokens[0] - st.item.arrival_s > st.ttft_budget_s)


def first_refusal(items: list, states: list) -> float | None:
    """When admission first refused, after the first arrival (None: never)."""
    refused = [st.item.arrival_s for st in states if st.error and not st.expired]
    return min(refused) - items[0].arrival_s if refused else None


def main(argv: list[str] | None = None) -> int:
    from tokenyard.shared.slo import ttft_target_s

    items, states = burst(parser().parse_args(argv))
    refused = sorted(st.item.arrival_s for st in states if st.error and not st.expired)
    t0 = items[0].arrival_s
    if refused:
        before = sum(it.arrival_s < refused[0] for it in items)
        print(f"first refusal {refused[0] - t0:.3f} s after the first arrival ({before} arrivals before it)")
    else:
        print("no refusal")
    print(f"refused {len(refused)}  expired {sum(st.expired for st in states)}  of {len(items)}")
    failed, first_failed = admitted_but_failed(states, t0)
    if first_failed is not None:
        print(f"admitted, then late or expired: {failed}, the first arrived {first_failed:.3f} s after the first arrival")
    else:
        print("admitted, then late or expired: none")
    for c in range(4):
        mine = [st for st in states if st.item.priority == c]
        if not mine:
            continue
        lost = sorted(st.item.arrival_s - t0 for st in mine if st.error and not st.expired)
        first = f"first refused {lost[0]:.3f} s" if lost else "none refused"
        line = (f"P{c} sent {len(mine)}  refused {len(lost)}  expired {sum(st.expired for st in mine)}  {first}")
        ttft = [st.tokens[0] - st.item.arrival_s for st in mine if st.finished and len(st.tokens)]
        if ttft:
            p99 = float(np.percentile(ttft, 99))
            target = ttft_target_s(c)
            vs = f"= {p99 / target:.2f} × target" if np.isfinite(target) else "(no target)"
            line += (f"  served {len(ttft)} ({sum(map(late, mine))} past their deadline)  p50 {np.median(ttft):.2f} s  "
                     f"p99 {p99:.2f} s  {vs}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
