"""`tokenyard sim` (docs/ARCHITECTURE.md §9): replay a workload through the cores on a virtual clock.

    tokenyard sim --workload NAME (loadgen.workloads.WORKLOADS) --instances N --profile P
                  [--policy X | --compare A,B,...]
                  [--macro-size K --mode nodg|ecoserve|pd[,…]] [--no-chunked-prefill]
                  [--prefill-only-phases] [--pd-prefill K] [--max-model-len N] [--mitosis]
                  [--queue-policy Q] [--flow-control on|off] [--priority-mix a,b,c,d] [--goodput ttft:MS tpot:MS]
                  [--seed S | --seeds A-B|A,B,… [--jobs N]] [--json FILE] [--plots DIR]
                  [--rate R] [--burstiness K] [--rate-scale X] [--time-scale X]
                  [--num-requests N] [--duration S] [--skip-requests N] [--input-len N --output-len N] (synthetic)

`--num-requests` takes the first N requests (of a trace; a synthetic workload makes N, 1000
by default); `--duration` drops arrivals at or after S virtual seconds (after scaling). Several modes
(`--mode ecoserve,nodg,pd`) run one after the other on the same requests, ratios to the first.
`--seeds` runs the whole comparison once per seed (simulator/over_seeds.py) and prints the mean
and the paired difference to the first over the seeds (simulator/seeds.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any, NamedTuple


def register(sub) -> None:
    from tokenyard.loadgen.workloads import workload_help
    from tokenyard.services.priority_queue.policies.registry import DEFAULT_POLICY as DEFAULT_QUEUE_POLICY
    from tokenyard.services.priority_queue.policies.registry import POLICY_NAMES
    from tokenyard.services.worker.sim.latency import PROFILES

    p = sub.add_parser(
        "sim",
        help="replay a workload through the cores on a virtual clock (cluster simulator)",
        description="Replay a trace or synthetic workload through admission → queue → router → "
        "simulated engines on a virtual clock, and compare routing policies: on one seed, or paired over "
        "several (--seeds).",
    )
    p.add_argument("--workload", required=True, help=workload_help())
    p.add_argument("--instances", type=int, default=16, help="simulated engine instances")
    p.add_argument("--profile", default="a100-llama3-8b", help=f"latency profile: {', '.join(PROFILES)}")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--policy", default=None, help="routing policy (default: the router's own default)")
    group.add_argument("--compare", default=None, metavar="A,B,...", help="run several policies; ratios to the first")
    p.add_argument("--macro-size", type=int, default=None, metavar="K", help="group workers into macro-instances of K")
    p.add_argument(
        "--mode", default="nodg",
        help="macro-instance mode: nodg (every worker mixed), ecoserve (rolling prefill phases), pd (spatial "
        "prefill/decode workers, KV sent between them); a comma list compares them",
    )
    p.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_false",
                   help="engines prefill whole prompts in steps of their own (vLLM without chunked prefill)")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None, metavar="N",
                   help="vLLM's setting: the most prompt tokens one request prefills in a step while others "
                        "are in the engine (default 0: no cap, as vLLM)")
    p.add_argument("--prefill-only-phases", action="store_true",
                   help="ecoserve: a prefill phase prefills only, its decodes wait (EcoServe's rule)")
    p.add_argument("--pd-prefill", type=int, default=None, metavar="K",
                   help="pd: prefill workers per macro-instance (default: half, rounded up)")
    p.add_argument("--max-model-len", type=int, default=131_072, help="longest prompt + output admitted")
    p.add_argument("--mitosis", action="store_true",
                   help="mitosis scaling acted on: workers added and removed as the macro controller says")
    p.add_argument("--queue-policy", default=DEFAULT_QUEUE_POLICY,
                   help=f"the priority queue's ordering: {', '.join(POLICY_NAMES)} "
                        "(default: %(default)s, as `tokenyard queue`)")
    p.add_argument("--flow-control", choices=("on", "off"), default="on",
                   help="the queue holds the backlog while the fleet is saturated (default: on, as live)")
    p.add_argument("--heartbeat-s", type=float, default=0.1, metavar="S",
                   help="workers' heartbeat interval, virtual seconds (default 0.1, as live at full speed; a live "
                        "worker at --speed X sends one every 0.1 × X of its simulated seconds)")
    p.add_argument("--priority-mix", default="0,1,0,0", help="fractions of P0..P3")
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    seed = p.add_mutually_exclusive_group()
    seed.add_argument("--seed", type=int, default=0, help="seed of the workload and the policies: same seed, same run")
    seed.add_argument("--seeds", default=None, metavar="A-B|A,B,...",
                      help="run the comparison once per seed (101-112, 1,2,3) and print each policy's mean "
                           "over the seeds and its paired difference to the first (mean ± standard error, "
                           "seeds better); --json holds every seed's results and the summary")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --seeds: seeds run in N processes at once (the results are the same)")
    p.add_argument("--rate", type=float, default=None, help="base rate of a synthetic workload (req/s; default: the workload's own base rate)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps; 1 = Poisson")
    p.add_argument("--rate-scale", type=float, default=1.0, help="replay X times faster")
    p.add_argument("--time-scale", type=float, default=1.0, help="stretch the clock X times (slower)")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens (synthetic)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens (synthetic)")
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths drawn within ±this fraction (synthetic)")
    p.add_argument("--num-requests", "--max-requests", dest="num_requests", type=int, default=None,
                   help="requests to replay (default: a whole trace, or 1000 generated)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="arrivals before S virtual seconds")
    p.add_argument("--skip-requests", type=int, default=0, metavar="N",
                   help="start a trace at its N-th request (default 0): tune on one part, report on another")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON here")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots here (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no table")
    p.set_defaults(func=main)


def _policies(args) -> list[str]:
    from tokenyard.services.router.core import POLICIES, RouterConfig

    names = args.compare.split(",") if args.compare else [args.policy or RouterConfig().policy]
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}")
    return names


def config_doc(args, workload, policies: list[str]) -> dict[str, Any]:
    return {
        "workload": args.workload,
        "num_requests": len(workload.items()),
        "block_tokens": workload.block_tokens,
        "instances": args.instances,
        "profile": args.profile,
        "policies": policies,
        "macro_size": args.macro_size,
        "mode": args.mode,
        "chunked_prefill": args.chunked_prefill,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "prefill_only_phases": args.prefill_only_phases,
        "pd_prefill": args.pd_prefill,
        "max_model_len": args.max_model_len,
        "mitosis": args.mitosis,
        "queue_policy": args.queue_policy,
        "flow_control": args.flow_control,
        "heartbeat_s": args.heartbeat_s,
        "priority_mix": args.priority_mix,
        "seed": args.seed,
        "rate": args.rate,
        "burstiness": args.burstiness,
        "rate_scale": args.rate_scale,
        "time_scale": args.time_scale,
        "duration": args.duration,
        "skip_requests": args.skip_requests,
    }


class Prepared(NamedTuple):
    """One run's inputs, checked: what `--seed` (or one of `--seeds`) draws."""

    workload: Any
    cfg: Any  # SimConfig of the first policy / mode
    names: list[str]  # the policies compared, or the modes where several are
    modes: list[str]
    goodput: dict[str, float]


def prepare(args: argparse.Namespace, seed: int) -> Prepared:
    """The workload and fleet of a run at `seed`; a bad option raises ValueError or KeyError
    with its message, before anything runs."""
    from tokenyard.loadgen.config import parse_goodput, parse_priority_mix
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import ClusterSim, SimConfig

    policies = _policies(args)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()] or ["nodg"]
    goodput = parse_goodput(args.goodput)
    mix = parse_priority_mix(args.priority_mix)
    if args.instances < 1:
        raise ValueError("--instances must be >= 1")
    workload = open_workload(
        args.workload,
        num_requests=args.num_requests,
        rate=args.rate,
        burstiness=args.burstiness,
        rate_scale=args.rate_scale,
        time_scale=args.time_scale,
        priority_mix=mix,
        seed=seed,
        duration_s=args.duration,
        skip_requests=args.skip_requests,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
    )
    if not workload.items():
        raise ValueError("the workload has no requests")
    if args.heartbeat_s <= 0:
        raise ValueError("--heartbeat-s must be positive")
    cfg = SimConfig(
        instances=args.instances,
        profile=args.profile,
        policy=policies[0],
        queue_policy=args.queue_policy,
        flow_control=args.flow_control == "on",
        heartbeat_s=args.heartbeat_s,
        macro_size=args.macro_size,
        mode=modes[0],
        seed=seed,
        chunked_prefill=args.chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        prefill_only_phases=args.prefill_only_phases,
        pd_prefill=args.pd_prefill,
        max_model_len=args.max_model_len,
        mitosis=args.mitosis,
    )
    if len(modes) > 1 and len(policies) > 1:
        raise ValueError("compare several modes or several policies, not both")
    for mode in modes:  # bad profile / queue policy / mode fail here
        ClusterSim(replace(cfg, mode=mode), workload.block_tokens)
    return Prepared(workload, cfg, modes if len(modes) > 1 else policies, modes, goodput)


def run(prep: Prepared, with_series: bool = False):
    """Every policy (or mode) of `prep` on its requests: {name: result} (and series if asked)."""
    from tokenyard.simulator.run import compare, compare_modes

    if len(prep.modes) > 1:
        return compare_modes(prep.workload, prep.cfg, prep.modes, prep.goodput or None, with_series=with_series)
    return compare(prep.workload, prep.cfg, prep.names, prep.goodput or None, with_series=with_series)


def main(args: argparse.Namespace) -> int:
    from tokenyard.simulator import report

    if args.seeds is not None:
        from tokenyard.simulator.over_seeds import main as over_seeds

        return over_seeds(args)
    try:
        prep = prepare(args, args.seed)
    except (ValueError, KeyError) as e:
        print(f"tokenyard sim: error: {e}", file=sys.stderr)
        return 2
    results, series = run(prep, with_series=True)
    policies = prep.names
    if not args.quiet:
        report.print_results(results, title=f"{args.workload} · {args.instances} × {args.profile}")
    if args.json:
        doc: dict[str, Any] = {"config": config_doc(args, prep.workload, policies), "policies": results}
        if len(policies) == 1:
            doc.update(results[policies[0]])
        report.write_json(doc, args.json)
    if args.plots:
        for path in report.plots(series, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0
