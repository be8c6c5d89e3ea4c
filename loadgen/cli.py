"""`tokenyard bench …`: benchmarks. `bench serve` drives a running fleet the way
`vllm bench serve` drives a vLLM server (same option names where vllm has one, and its
spellings `--request-rate` / `--max-concurrency` / `--disable-tqdm` as aliases). `bench router`
(issue 5, loadgen/router_bench.py) times the router core's decisions."""

from __future__ import annotations

import argparse
import asyncio
import sys

from tokenyard.loadgen.config import (
    DEFAULT_PRIORITY_MIX,
    BenchConfig,
    parse_goodput,
    parse_priority_mix,
    parse_tpot_slo_mix,
)
from tokenyard.loadgen.workloads import workload_help
from tokenyard.shared import config as shared_config


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmark a fleet or a component")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    serve = bench_sub.add_parser(
        "serve",
        help="drive a fleet with a workload and report latency and throughput (vllm bench serve)",
        description="Send a seeded workload to a tokenyard fleet over NATS or HTTP and report "
        "TTFT / TPOT / ITL / E2EL, throughput and goodput with vllm bench serve's key names.",
    )
    add_serve_args(serve)
    serve.set_defaults(func=serve_main)
    register_router_bench(bench_sub)


def register_router_bench(bench_sub) -> None:
    """`bench router` (issue 5): the router core's decision latency (loadgen/router_bench.py)."""
    from tokenyard.loadgen import router_bench

    router = bench_sub.add_parser(
        "router",
        help="the router's decision latency on a warm fleet with a large KV block index",
        description="Route trace requests through RouterCore over N instances with a KV block index of "
        "at least M blocks and report decision latency p50 / p99 (p50_us, p99_us).",
    )
    router_bench.add_args(router)
    router.set_defaults(func=router_bench.main)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument(
        "--target", default=shared_config.nats_url_from_env(), help="nats://HOST:PORT or http://HOST:PORT"
    )
    p.add_argument("--model", default=d.model, help="model name sent with each request")
    p.add_argument(
        "--workload", default=d.workload, help=workload_help()
    )
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="requests to send")
    p.add_argument("--input-len", type=int, default=d.input_len, help="prompt tokens (synthetic)")
    p.add_argument(
        "--output-len", type=int, default=d.output_len, help="max_tokens, with ignore_eos (synthetic)"
    )
    p.add_argument(
        "--range-ratio", type=float, default=d.range_ratio, help="lengths uniform in len·[1−r, 1+r]"
    )
    p.add_argument(
        "--rate", "--request-rate", dest="rate", type=float, default=d.rate, help="req/s; inf = all at once"
    )
    p.add_argument("--burstiness", type=float, default=d.burstiness, help="gamma shape of gaps; 1 = Poisson")
    p.add_argument("--concurrency", "--max-concurrency", dest="concurrency", type=int, default=None,
                   help="most requests in flight at once (default: no limit)")
    p.add_argument(
        "--priority-mix", default=",".join(f"{x:g}" for x in DEFAULT_PRIORITY_MIX), help="fractions of P0..P3"
    )
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--tpot-slo-mix", default=None, metavar="MS:FRACTION,…",
                   help="each request sends a tpot_slo_ms drawn from this mix (seeded), e.g. 50:0.5,200:0.5; "
                   "goodput then judges each request by its own TPOT SLO and reports each SLO's requests")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the workload: same seed, same requests")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    p.add_argument("--tenant", default=None, help="tenant the requests are charged to (default: none)")
    p.add_argument("--result-json", default=None, metavar="FILE", help="also write the result as JSON here")
    p.add_argument("--plots", default=None, metavar="DIR",
                   help="write PNG figures here: TTFT/TPOT CDFs, latency by class, per-worker load")
    p.add_argument("--fleet-nats", default=None, metavar="URL",
                   help="read worker heartbeats here for the per-worker plot (default: the target, if NATS)")
    p.add_argument("--no-progress", "--disable-tqdm", dest="no_progress", action="store_true",
                   help="no progress bar")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the options describe; ValueError on a bad one."""
    cfg = BenchConfig(
        target=args.target,
        model=args.model,
        workload=args.workload,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        rate=args.rate,
        burstiness=args.burstiness,
        concurrency=args.concurrency,
        priority_mix=parse_priority_mix(args.priority_mix),
        goodput=parse_goodput(args.goodput),
        tpot_slo_mix=parse_tpot_slo_mix(args.tpot_slo_mix),
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        progress=not args.no_progress,
        tenant=args.tenant,
        plots_dir=args.plots,
        fleet_nats=args.fleet_nats,
    )
    cfg.validate()
    return cfg


def serve_main(args: argparse.Namespace) -> int:
    from tokenyard.loadgen.report import print_result, write_result_json
    from tokenyard.loadgen.serve import run_bench
    from tokenyard.loadgen.workload import make_workload

    try:
        cfg = config_from_args(args)
        make_workload(cfg)  # an unknown workload fails here, before connecting
    except ValueError as e:
        print(f"tokenyard bench serve: error: {e}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_bench(cfg))
    except KeyboardInterrupt:
        print("tokenyard bench serve: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the target could not be reached at all
        print(
            f"tokenyard bench serve: cannot run against {cfg.target}: {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 1
    print_result(result)
    for name, path in result.get("plots", {}).items():
        print(f"plot {name}: {path}")
    if result.get("plots_note"):
        print(result["plots_note"])
    if args.result_json:
        write_result_json(result, args.result_json)
    return 0
