"""Control-plane benchmark: what tokenyard itself costs, with the engine's cost taken out.

    python -m bench.control_plane [--workers 2] [--json results/control_plane.json]
    python -m bench.control_plane --nats nats://H:P --http http://H:P    # an already running fleet
    python -m bench.control_plane --baseline main    # side by side with another commit's code
    python -m bench.control_plane --baseline HEAD --baseline-router separate   # the router's crossing alone
    python -m bench.control_plane --baseline HEAD --baseline-admission separate   # admission's hand-over alone
    python -m bench.control_plane --baseline HEAD --baseline-edge-processes 2   # the edge's own processes alone

It brings a fleet up with `tokenyard.launcher.FleetProcesses(workers=2, profile="zero")`:
simulated workers whose every step takes zero time, so whatever latency a client sees is the
control plane's (edge → admission → queue → router → worker → back to the client). The router
and admission run in the queue's process, as `tokenyard up` runs them (`--router separate`,
`--admission separate`: each its own process, one NATS crossing more each), and so does the
HTTP edge (`--edge-processes N`: N edge processes of their own, one more crossing each way).

(a) Time added to first token. `bench serve` with max_tokens = 1, short prompts, at a low
    Poisson rate (default 20 req/s, so requests do not queue behind each other), after a
    warm-up run that is discarded; once from a NATS client (llm.v1.submit) and once over HTTP
    through the edge. Then, over NATS, the same requests one at a time, each round one through
    the control plane and one to the engine alone (offered straight to a worker's generate
    endpoint, as admission would have made it; bench/hop_profile.py `send_engine`), in a
    random order: the TTFT the control plane adds is the first's less the second's, p50 of
    each (both paths end with the worker's first chunk crossing to the client). Over HTTP the
    same, in the same rounds: through the edge, and to the same engine's own HTTP front (each
    worker runs one, `tokenyard worker --http PORT`), so the client's HTTP cost is in both.
    Targets: added p50 ≤ 2 ms (NATS and HTTP; the full TTFT rows are printed beside, and an
    already running fleet, whose workers' fronts are unknown, is held to its full HTTP TTFT);
    TTFT p99 ≤ 10 ms. The CPU each process of the fleet spends per
    request over the TTFT runs is printed beside (user + system from /proc, idle loops in).

(b) Highest sustained request rate. The offered Poisson rate steps up (default 250, 500,
    1000, 1500, 2000 req/s), each step max(--min-prompts, rate × --step-seconds) requests
    of short prompts with max_tokens = 4, over NATS. A step holds when

        achieved = completed / duration  ≥  0.95 × offered,   failed = 0

    where offered = (N − 1) / (last arrival offset), the rate the seeded schedule actually
    realised (a Poisson schedule's own rate is off the nominal one by ~1/√N). The result is
    the highest held step; stepping stops at the first step that does not hold.
    Target: ≥ 1,000 req/s.
    `max_send_lag_ms` per step shows when the load generator itself fell behind its
    schedule (one Python process); a step missed with a large lag is client-bound.

(c) Where the first token's time goes, hop by hop (bench/hop_profile.py): a second fleet
    with tracing on exports every hop's spans to this process; the TTFT of each request,
    one at a time, is cut at the spans' edges — edge, admission, the JetStream hop, queue,
    router, worker and back — and the medians are printed per path. Tracing adds its own
    cost to each hop, so these totals exceed (a)'s; skip with --profile-requests 0.

(d) Side by side (--baseline REF): two fleets at once, one running REF's code (bench/baseline.py),
    one this tree's; each request goes to both in turn (random order each round), one at a
    time at the TTFT rate, first untraced for the TTFT, then traced for the per-hop profile.
    On a shared machine the two see the same load at the same moments, so the difference is
    the code's. The rate steps are skipped (two fleets would compete for the CPUs).

Exit code 0 when every target is met, 1 when one is missed, 2 when the run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.serve import run_bench
from tokenyard.shared import config as shared_config

from bench._out import write_result
from bench.control_plane_tables import print_report

TTFT_P50_MS = 2.0
TTFT_P99_MS = 10.0
RATE_GOAL = 1000.0
HOLD_FRACTION = 0.95
DEFAULT_RATES = (250.0, 500.0, 1000.0, 1500.0, 2000.0)


async def ttft_overhead(target: str, args: argparse.Namespace) -> dict[str, Any]:
    """TTFT with max_tokens = 1 at a low rate, after a discarded warm-up."""

    def cfg(n: int, seed: int) -> BenchConfig:
        return BenchConfig(
            target=target,
            model=args.model,
            num_prompts=n,
            input_len=args.input_len,
            output_len=1,
            rate=args.ttft_rate,
            seed=seed,
            progress=False,
            request_timeout_s=30.0,
        )

    if args.warmup:
        await run_bench(cfg(args.warmup, seed=1))
    r = await run_bench(cfg(args.ttft_prompts, seed=0))
    return {
        "target": target,
        "num_prompts": args.ttft_prompts,
        "rate": args.ttft_rate,
        "completed": r["completed"],
        "failed": r["failed"],
        "errors": r["errors"],
        "p50_ttft_ms": r["median_ttft_ms"],
        "p90_ttft_ms": r["p90_ttft_ms"],
        "p99_ttft_ms": r["p99_ttft_ms"],
        "mean_ttft_ms": r["mean_ttft_ms"],
    }


async def rate_steps(target: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i, rate in enumerate(args.rates):
        n = max(args.min_prompts, int(rate * args.step_seconds))
        r = await run_bench(
            BenchConfig(
                target=target,
                model=args.model,
                num_prompts=n,
                input_len=args.input_len,
                output_len=4,
                rate=rate,
                seed=100 + i,
                progress=False,
                request_timeout_s=30.0,
            )
        )
        offered = realised_rate(n, r["arrival_span_s"], rate)
        achieved = r["request_throughput"]
        held = holds(offered, achieved, r["failed"])
        steps.append(
            {
                "rate": rate,
                "num_prompts": n,
                "offered": offered,
                "achieved": achieved,
                "completed": r["completed"],
                "failed": r["failed"],
                "errors": r["errors"],
                "p50_ttft_ms": r["median_ttft_ms"],
                "p99_ttft_ms": r["p99_ttft_ms"],
                "p99_e2el_ms": r["p99_e2el_ms"],
                "max_send_lag_ms": r["max_send_lag_ms"],
                "held": held,
            }
        )
        if not held:
            break
    return steps


def realised_rate(n: int, arrival_span_s: float, nominal: float) -> float:
    """The rate a schedule of n arrivals over `arrival_span_s` actually offers: (n − 1) / span."""
    return (n - 1) / arrival_span_s if n > 1 and arrival_span_s > 0 else nominal


def holds(offered: float, achieved: float, failed: int) -> bool:
    return failed == 0 and achieved >= HOLD_FRACTION * offered


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """(what, measured, goal, met) for each target."""
    out = []
    for path in ("nats", "http"):
        t = result["ttft"].get(path)
        if t is None:
            continue
        ok = t["failed"] == 0
        plus = result.get("added" if path == "nats" else "http_added")
        if plus:  # the full path less the engine alone
            out.append(_verdict(f"{path} TTFT added p50 (ms)", plus["p50_ms"], f"≤ {TTFT_P50_MS:g}",
                                ok and plus["p50_ms"] <= TTFT_P50_MS))
        else:
            out.append(_verdict(f"{path} TTFT p50 (ms)", t["p50_ttft_ms"], f"≤ {TTFT_P50_MS:g}",
                                ok and t["p50_ttft_ms"] <= TTFT_P50_MS))
        out.append(
            _verdict(
                f"{path} TTFT p99 (ms)",
                t["p99_ttft_ms"],
                f"≤ {TTFT_P99_MS:g}",
                ok and t["p99_ttft_ms"] <= TTFT_P99_MS,
            )
        )
    best = result["sustained_rate"]
    if best is None:  # side by side: no rate steps
        return out
    out.append(_verdict("sustained rate (req/s)", best, f"≥ {RATE_GOAL:,.0f}", best >= RATE_GOAL))
    return out


def _verdict(what: str, measured: float, goal: str, met: bool) -> dict[str, Any]:
    return {"what": what, "measured": measured, "goal": goal, "met": bool(met)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.baseline:
        return await side_by_side(args)
    if args.nats:
        return await measure(args.nats, args.http, args)
    from tokenyard.launcher import FleetProcesses

    async with FleetProcesses(workers=args.workers, profile="zero", http_port=0, model=args.model,
                              router=args.router, admission=args.admission, worker_http=True,
                              edge_processes=args.edge_processes) as fleet:
        result = await measure(fleet.nats_url, fleet.http_url, args, fleet)
    result["router"] = args.router
    if args.profile_requests > 0:
        from bench import hop_profile

        result["hops"] = await hop_profile.profile(args.workers, args.model, args.profile_requests, args.ttft_rate,
                                                   router=args.router, admission=args.admission)
    return result


THIS_TREE = "this tree"


async def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """(d): REF's fleet and this tree's, interleaved; TTFT untraced, then the hops traced."""
    from bench import hop_profile
    from bench.baseline import baseline_env, commit_of, has_text

    # A commit from before `tokenyard queue --with-router` runs its router on its own.
    can = has_text(args.baseline, "services/priority_queue/cli.py", "--with-router")
    base_router = args.baseline_router or ("in-queue" if can else "separate")
    if base_router == "in-queue" and not can:
        raise ValueError(f"{args.baseline} has no router in the queue's process (tokenyard queue --with-router)")
    routers = {args.baseline: base_router, THIS_TREE: args.router}
    # A commit from before `tokenyard queue --with-admission` runs admission on its own.
    can = has_text(args.baseline, "services/priority_queue/cli.py", "--with-admission")
    base_admission = args.baseline_admission or ("in-queue" if can else "separate")
    if base_admission == "in-queue" and not can:
        raise ValueError(f"{args.baseline} has no admission in the queue's process (tokenyard queue --with-admission)")
    admissions = {args.baseline: base_admission, THIS_TREE: args.admission}
    # A commit from before `tokenyard queue --http-port` runs its edge on its own, as its `up` does.
    can = has_text(args.baseline, "services/priority_queue/cli.py", "--http-port")
    base_edges = args.baseline_edge_processes
    if base_edges is None:
        base_edges = 0 if can else shared_config.edge_processes()
    if base_edges == 0 and not can:
        raise ValueError(f"{args.baseline} has no edge in the queue's process (tokenyard queue --http-port)")
    edges = {args.baseline: base_edges, THIS_TREE: args.edge_processes}
    with baseline_env(args.baseline) as env:
        fleets = {args.baseline: env, THIS_TREE: {}}
        ttft = await hop_profile.side_by_side(fleets, args.workers, args.model, args.ttft_prompts, args.ttft_rate,
                                              traced=False, warmup=args.warmup, routers=routers,
                                              admissions=admissions, edges=edges)
        hops = None
        if args.profile_requests > 0:
            hops = await hop_profile.side_by_side(fleets, args.workers, args.model, args.profile_requests,
                                                  args.ttft_rate, traced=True, warmup=args.warmup, routers=routers,
                                                  admissions=admissions, edges=edges)
    result: dict[str, Any] = {"workers": args.workers, "baseline": args.baseline,
                              "baseline_commit": commit_of(args.baseline), "routers": routers,
                              "admissions": admissions, "edge_processes": edges,
                              "paired_ttft": ttft, "paired_hops": hops}
    mine = ttft[THIS_TREE]
    result["ttft"] = {path: {"completed": r["completed"], "failed": r["sent"] - r["completed"],
                             **{f"{k[:-3]}_ttft_ms": v for k, v in r["ttft"].items()}}
                      for path, r in mine.items() if path in ("nats", "http")}
    result["added"] = mine["nats"].get("added")
    result["http_added"] = mine["http"].get("added")
    result["steps"], result["sustained_rate"] = [], None
    result["verdicts"] = verdicts(result)
    return result


async def measure(nats_url: str, http_url: str | None, args: argparse.Namespace, fleet=None) -> dict[str, Any]:
    """`fleet`: the FleetProcesses behind the URLs, when this process started it: then the CPU
    each of its processes spends per request is measured too (the TTFT runs, untraced)."""
    from bench import hop_profile

    result: dict[str, Any] = {"workers": args.workers, "nats_url": nats_url, "http_url": http_url, "ttft": {}}
    cpu: dict[str, dict[str, float]] = {}
    idle_rate = (await hop_profile.idle_cpu_rates({"": fleet}, hop_profile.IDLE_WINDOW_S))[""] if fleet else {}

    async def timed(path: str, target: str) -> dict[str, Any]:
        before, t0 = (hop_profile.cpu_seconds(fleet), time.monotonic()) if fleet is not None else (None, 0.0)
        r = await ttft_overhead(target, args)
        if before is not None:
            after, wall, n = hop_profile.cpu_seconds(fleet), time.monotonic() - t0, args.ttft_prompts + args.warmup
            cpu[path] = {name: (after[name] - before[name]) * 1e3 / n for name in before}
            cpu[path + ", idle subtracted"] = {
                name: (after[name] - before[name] - idle_rate.get(name, 0.0) * wall) * 1e3 / n for name in before}
        return r

    result["ttft"]["nats"] = await timed("nats", nats_url)

    try:  # offering to a worker directly takes an operator's (or the router's) NATS rights
        result["engine_paired"] = await hop_profile.engine_paired(
            nats_url, args.model, args.ttft_prompts, args.ttft_rate, warmup=args.warmup, http_url=http_url,
            worker_urls=fleet.worker_http_urls if fleet is not None else None)
        result["added"] = result["engine_paired"]["added"]
        result["http_added"] = result["engine_paired"].get("http_added")
    except (PermissionError, TimeoutError, OSError) as e:
        print(f"no engine-alone run ({type(e).__name__}: {e}): the NATS target is held against the whole TTFT")
    if http_url:
        result["ttft"]["http"] = await timed("http", http_url)
    if cpu:
        result["cpu_ms_per_request"] = cpu
    result["rate_path"] = args.rate_path
    result["steps"] = await rate_steps(http_url if args.rate_path == "http" and http_url else nats_url, args)
    result["sustained_rate"] = max((s["rate"] for s in result["steps"] if s["held"]), default=0.0)
    result["verdicts"] = verdicts(result)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2,
                   help="zero-latency worker processes in each fleet this bench starts (default: %(default)s)")
    p.add_argument("--model", default=shared_config.DEFAULT_MODEL, help="model name every request asks for (default: %(default)s)")
    p.add_argument("--nats", help="benchmark this running fleet instead of starting one")
    p.add_argument("--http", help="its edge (with --nats); the HTTP TTFT is skipped without it")
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens of every request")
    p.add_argument("--ttft-prompts", type=int, default=300,
                   help="requests in each TTFT run, after the warm-up (default: %(default)s)")
    p.add_argument("--ttft-rate", type=float, default=20.0,
                   help="requests a second (Poisson) of the TTFT runs and the hop profile (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=30,
                   help="requests sent before each TTFT run and left out of it (default: %(default)s; 0: none)")
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=list(DEFAULT_RATES),
                   help="offered requests a second of the rate steps, comma list, in order "
                        f"(default: {','.join(f'{r:g}' for r in DEFAULT_RATES)})")
    p.add_argument("--step-seconds", type=float, default=3.0, help="each rate step lasts about this long")
    p.add_argument("--min-prompts", type=int, default=500,
                   help="fewest requests in one rate step (default: %(default)s)")
    p.add_argument("--rate-path", choices=("nats", "http"), default="nats",
                   help="the rate steps' client: on NATS (the target's figure), or on the edge's HTTP port "
                        "(what the HTTP front's layout, --edge-processes, holds)")
    p.add_argument("--profile-requests", type=int, default=200,
                   help="requests a path for the per-hop profile, on a second, traced fleet (0: skip)")
    p.add_argument("--baseline", metavar="REF",
                   help="measure side by side with this commit's code (a branch, tag or hash), interleaved")
    p.add_argument("--router", choices=("in-queue", "separate"), default="in-queue",
                   help="where this tree's fleet runs its router: in the queue's process, or its own")
    p.add_argument("--baseline-router", choices=("in-queue", "separate"), default=None,
                   help="the same for the --baseline fleet (default: in-queue where that commit has it, else separate)")
    p.add_argument("--admission", choices=("in-queue", "separate"), default="in-queue",
                   help="where this tree's fleet runs admission: in the queue's process, or its own")
    p.add_argument("--baseline-admission", choices=("in-queue", "separate"), default=None,
                   help="the same for the --baseline fleet (default: in-queue where that commit has it, else separate)")
    p.add_argument("--edge-processes", type=int, default=0, metavar="N",
                   help="this tree's fleet's edge processes of their own (default 0: the edge in the queue's process, "
                        "as `tokenyard up` runs it)")
    p.add_argument("--baseline-edge-processes", type=int, default=None, metavar="N",
                   help="the same for the --baseline fleet (default: what that commit's `up` runs — in the queue's "
                        "process where it has `queue --http-port`, else one per CPU)")
    p.add_argument("--json", help="write the result here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    load_before = os.getloadavg()
    try:
        result = asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        console.print(f"[red]control-plane benchmark failed: {type(e).__name__}: {e}")
        return 2
    result["load_avg"] = {"before": load_before, "after": os.getloadavg()}  # 1, 5, 15 min
    print_report(result, console)
    console.print(f"load average before {', '.join(f'{x:.2f}' for x in load_before)}; "
                  f"after {', '.join(f'{x:.2f}' for x in result['load_avg']['after'])}")
    write_result(args.json, result, prog="python -m bench.control_plane", argv=argv)
    return 0 if all(v["met"] for v in result["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
