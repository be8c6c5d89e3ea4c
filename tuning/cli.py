"""`tokenyard tune --workload W [--trials N]`: choose bubble_width and the aging thresholds
for a workload by Bayesian optimisation over the cluster simulator; prints the best settings
and the gain over the defaults (objective: tuning/objective.py).

    tokenyard tune --workload NAME (loadgen.workloads.WORKLOADS) [--trials 20]
                   [--instances 4] [--profile a100-llama3-8b] [--queue-policy bubble]
                   [--flow-control on|off [--slots-per-worker N]] [--num-requests 1000] [--rate R] [--rate-scale X]
                   [--priority-mix a,b,c,d] [--alpha 1 --beta 1 --gamma 1] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict


def register(sub) -> None:
    from tokenyard.loadgen.workloads import workload_help

    p = sub.add_parser("tune", help="tune the queue's bubble width and aging over the simulator (optuna)")
    p.add_argument("--workload", required=True, help=workload_help())
    p.add_argument("--trials", type=int, default=20, help="settings tried after the defaults")
    p.add_argument("--instances", type=int, default=4, help="simulated engine instances")
    p.add_argument("--profile", default="a100-llama3-8b", help="latency profile of the simulated engines")
    p.add_argument("--queue-policy", default="bubble", help="the policy whose knobs are tuned")
    p.add_argument("--flow-control", choices=("on", "off"), default="on",
                   help="the queue holds the backlog while the fleet is saturated, so the tuned policy orders "
                        "it (default: on, as live)")
    p.add_argument("--slots-per-worker", type=int, default=None,
                   help="with --flow-control off only: waiting requests the queue lets a worker hold "
                        "(default: 64, as `tokenyard queue`); with flow control on the queue releases by the "
                        "workers' prefill room and no slot count applies")
    p.add_argument("--num-requests", type=int, default=1000, help="requests per simulated run")
    p.add_argument("--rate", type=float, default=None, help="arrival rate, requests/s (synthetic workloads; default: the workload's own base rate)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="replay X times faster")
    p.add_argument("--priority-mix", default="0,1,0,0", help="fractions of P0..P3")
    p.add_argument("--alpha", type=float, default=1.0, help="weight of throughput")
    p.add_argument("--beta", type=float, default=1.0, help="weight of long-request completion")
    p.add_argument("--gamma", type=float, default=1.0, help="weight of short-request latency")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the search")
    p.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON here")
    p.set_defaults(func=main)


def open_any(args, mix):
    from tokenyard.loadgen.workloads import open_workload

    return open_workload(args.workload, num_requests=args.num_requests, rate=args.rate, rate_scale=args.rate_scale,
                         priority_mix=mix, seed=args.seed)


def main(args: argparse.Namespace) -> int:
    from tokenyard.loadgen.config import parse_priority_mix
    from tokenyard.loadgen.report import write_result_json
    from tokenyard.simulator.cluster import SimConfig
    from tokenyard.tuning.evaluate import SimSetup
    from tokenyard.tuning.objective import Weights
    from tokenyard.tuning.search import tune

    try:
        mix = parse_priority_mix(args.priority_mix)
        workload = open_any(args, mix)
        if args.trials < 1:
            raise ValueError("--trials must be >= 1")
        cfg = SimConfig(instances=args.instances, profile=args.profile, seed=args.seed,
                        flow_control=args.flow_control == "on")
        if args.slots_per_worker is not None:
            if cfg.flow_control:
                raise ValueError("--slots-per-worker acts only with --flow-control off (flow control releases by "
                                 "the workers' prefill room, not by a slot count)")
            if args.slots_per_worker < 1:
                raise ValueError("--slots-per-worker must be >= 1")
            cfg.slots_per_worker = args.slots_per_worker
        setup = SimSetup(workload, cfg, args.queue_policy)
    except (ValueError, KeyError) as e:
        print(f"tokenyard tune: error: {e}", file=sys.stderr)
        return 2
    res = tune(setup.run, args.trials, Weights(args.alpha, args.beta, args.gamma), seed=args.seed)
    rows = [("default", res.default_score, res.default), ("best", res.best_score, res.best)]
    print(f"tokenyard tune · {args.workload} · {args.instances} × {args.profile} · {args.queue_policy} · "
          f"{args.trials} trials")
    print("best settings: " + "  ".join(f"{k}={v:.3g}" for k, v in sorted(res.best_params.items())))
    print(f"{'':8} {'score':>8} {'req/s':>8} {'long in time':>12} {'short p50 TTFT s':>17} {'long p99 TTFT s':>16}")
    for name, s, m in rows:
        print(f"{name:8} {s:8.3f} {m.throughput:8.3f} {m.long_done:12.3f} {m.short_p50_ttft_s:17.3f} "
              f"{m.long_p99_ttft_s:16.3f}")
    print(f"gain over defaults: {res.gain:+.3f} ({res.gain / abs(res.default_score) * 100 if res.default_score else 0:+.1f}%)")
    if args.json:
        doc = {"workload": args.workload, "queue_policy": args.queue_policy, "trials": args.trials,
               "best_params": res.best_params, "best_score": res.best_score, "default_score": res.default_score,
               "gain": res.gain, "default": asdict(res.default), "best": asdict(res.best),
               "history": [{"params": p, "score": v} for p, v in res.trials]}
        write_result_json({"command": " ".join(["tokenyard", *sys.argv[1:]]), **doc}, args.json)
    return 0
