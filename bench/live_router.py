"""Live routers side by side: tokenyard's fleet against a real peer router, each in front of
the same kind of simulated workers, the same seeded workload from `tokenyard bench serve`.

    python -m bench.live_router [--workers 4] [--speed 0.25] [--workload chatbot]
                                [--base-rate R] [--loads 1,3] [--num-prompts N]
                                [--routers tokenyard,sglang,vllm] [--rounds 1] [--baseline REF] [--json FILE]

* tokenyard: `tokenyard up`'s processes (edge, admission, queue, router with its default
  policy, macro-instance, N `tokenyard worker --engine sim` workers), the client on the edge's
  HTTP port.
  The edge runs as `tokenyard up` runs it by default: in the queue's process (round 11).
* tokenyard-1edge: the same with a single edge process of its own (`--edge-processes 1`, the
  edge before round 6).
* tokenyard-noflow: the default fleet with the queue's flow control off (`tokenyard queue
  --flow-control off`: requests go to the router as they come, not when a worker's heartbeat
  shows room). A diagnostic of where the time goes, not a setting to use.
* tokenyard-ref: the same on another commit's code (`--baseline REF`, bench/baseline.py): before / after
  (REF must know `tokenyard edge --processes`, i.e. be round 6's or later).
* sglang: sglang-router from PyPI (`pip install sglang-router`, a Rust binary) with
  `--policy cache_aware` and its other defaults, in front of N `tokenyard worker --engine sim
  --http PORT` workers (each also joins a NATS server of its own, which nothing else uses).
* vllm: vLLM production-stack's router from PyPI (`pip install vllm-router`), `cache_aware`
  too, in front of the same kind of workers (skipped when not installed).

Every worker runs the a100-llama3-8b profile at `--speed` simulated seconds per wall second
(below 1: slower than real time), so the simulated GPUs, not the two shared CPU cores of the
machine this runs on, are the bottleneck: the workload's rate is scaled by `--speed` × workers
/ 16 from the rate it has on 16 real-time instances (`--base-rate`, default the workload's
own), and TTFT / TPOT are reported in simulated milliseconds (wall ms × speed). One run per
(router, load), in turn, never two at once.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.serve import run_bench
from tokenyard.loadgen.workloads.synthetic import SYNTHETIC
from tokenyard.services.router.core import DEFAULT_POLICY
from tokenyard.shared import config, natsutil

from bench._out import log_dir, write_result
from bench.baseline import baseline_env, has_text
from bench.route_log import (
    choice_summary,
    engine_placements,
    placements,
    route_choices,
    route_table,
    served_lines,
)
from tokenyard.launcher import FleetProcesses

PROFILE = "a100-llama3-8b"
SPEED = 0.25
"""Simulated seconds per wall second of the live benches' workers: at 0.1 a simulated A100
decodes slower than the default 100 ms TPOT SLO and admission refuses most requests."""
KEYS = ("completed", "failed", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
        "request_throughput", "prefix_hit_ratio")
TIME_KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms")
WALL_MS = ("ttft_ms", "since_admitted_ms", "engine_ttft_ms")
"""A request's times (bench.route_log), wall ms as measured, simulated ms in the JSON."""
PEERS = {  # name → (module run with `python -m`, pip package, arguments)
    "sglang": ("sglang_router.launch_router", "sglang-router", ["--policy", "cache_aware"]),
    "vllm": ("vllm_router.launch_router", "vllm-router", ["--policy", "cache_aware"]),
}


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(procs: list[tuple[str, subprocess.Popen]]) -> dict[str, float]:
    """User + system CPU seconds each named group of processes has used so far (/proc/PID/stat;
    every thread of a process counts: sglang-router's Rust workers too); `client` is this
    process (`tokenyard bench serve`'s load generator)."""
    out: dict[str, float] = {}
    for name, proc in procs:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        key = "workers" if "worker" in name else name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) * TICK_S
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["client"] = usage.ru_utime + usage.ru_stime
    return out


IDLE_WINDOW_S = 5.0
"""Before each run: how long the fleet is watched with no request in flight (`idle_cpu_ms_per_s`)."""


def _edge_processes(name: str, args) -> int:
    """What `tokenyard up` runs for the fleet `name`: the edge in the queue's process (0), or, on
    a --baseline commit from before `tokenyard queue --http-port`, one edge process per CPU."""
    if name == "tokenyard-1edge":
        return 1
    if name == "tokenyard-ref" and not has_text(args.baseline, "services/priority_queue/cli.py", "--http-port"):
        return config.edge_processes()
    return 0


async def measured(bench: BenchConfig, procs: list[tuple[str, subprocess.Popen]]) -> dict[str, Any]:
    """run_bench, with each process group's CPU milliseconds per request over the run
    (`cpu_ms_per_request`: what the fleet and the client cost on the shared CPUs), and, from
    IDLE_WINDOW_S just before it, what each group burns per second with nothing to do
    (`idle_cpu_ms_per_s`: heartbeats, polls, timers; the client's is left out)."""
    idle0, t0 = cpu_s(procs), time.monotonic()
    await asyncio.sleep(IDLE_WINDOW_S)
    before = cpu_s(procs)
    wall = time.monotonic() - t0
    idle = {k: round((before[k] - idle0.get(k, 0.0)) * 1000 / wall, 2) for k in before if k != "client"}
    res = await run_bench(bench)
    after = cpu_s(procs)
    n = max(1, bench.num_prompts)
    res["cpu_ms_per_request"] = {k: round((after[k] - before.get(k, 0.0)) * 1000 / n, 2) for k in after}
    res["idle_cpu_ms_per_s"] = idle
    return res


def _wait_http(url: str, procs: list[subprocess.Popen], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with code {p.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready in {timeout_s:.0f} s")
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def _peer(router: str, args, bench: BenchConfig, logs: Path) -> dict[str, Any]:
    module, package, router_args = PEERS[router]
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise FileNotFoundError(f"{package} is not installed (pip install {package})")
    server = await natsutil.NatsServer().start()
    procs: list[subprocess.Popen] = []
    files = []
    try:
        ports = [natsutil.free_port() for _ in range(args.workers)]
        env = {**os.environ, "TOKENYARD_LOG_LEVEL": "debug"} if args.route_log else None
        worker_logs = [logs / f"{router}-worker-{i}.log" for i in range(args.workers)]
        starts = [p.stat().st_size if p.exists() else 0 for p in worker_logs]
        for i, port in enumerate(ports):
            out = open(worker_logs[i], "ab")  # noqa: SIM115
            files.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tokenyard.cli", "worker", "--nats", server.url, "--engine", "sim",
                 "--profile", PROFILE, "--speed", str(args.speed), "--id", f"{router}-w{i}", "--http", str(port)],
                stdout=out, stderr=out, env=env))
        for port in ports:
            _wait_http(f"http://127.0.0.1:{port}/health", procs)
        rport = natsutil.free_port()
        out = open(logs / f"{router}-router.log", "ab")  # noqa: SIM115
        files.append(out)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module, *router_args, "--host", "127.0.0.1", "--port", str(rport), "--worker-urls", *urls],
            stdout=out, stderr=out))
        await asyncio.sleep(0)  # the router checks its workers' health before it listens
        _wait_http(f"http://127.0.0.1:{rport}/v1/models", procs[-1:], timeout_s=120.0)
        bench.target = f"http://127.0.0.1:{rport}"
        named = [("nats-server", server.proc), *[(f"worker-{i}", p) for i, p in enumerate(procs[:-1])],
                 ("router", procs[-1])]
        res = await measured(bench, named)
        res["worker_metrics"] = {f"w{i}": await asyncio.to_thread(_scrape, {"w": f"{u}/metrics"})
                                 for i, u in enumerate(urls)}
        res["fleet_metrics"] = {k: sum(m.get(k, 0.0) for m in res["worker_metrics"].values())
                                for k in {k for m in res["worker_metrics"].values() for k in m}}
        if args.route_log:  # each request's worker and what its engine did there
            for f in files:
                f.flush()
            served = [x for i, p in enumerate(worker_logs) for x in served_lines(p, starts[i], f"w{i}")]
            engine_placements(served, res.get("requests", []), peer=True)
        return res
    finally:
        _stop(procs)
        for f in files:
            f.close()
        server.stop()


FLEET_SERIES = ("tokenyard:queue_wait_seconds_sum", "tokenyard:queue_wait_seconds_count", "tokenyard:queue_dispatches_total",
                "tokenyard:router_decisions_total", "tokenyard:router_decision_seconds_sum",
                "tokenyard:router_decision_seconds_count", "tokenyard:edge_ttft_seconds_sum",
                "tokenyard:edge_ttft_seconds_count", "tokenyard:edge_ttft_seconds_bucket",
                "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                "vllm:time_to_first_token_seconds_bucket", "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_queries_total", "vllm:request_success_total")
"""What the fleet's own metrics say about a run (where a request waited): the queue's wait from
arrival to routed and its dispatches by outcome (a `no_capacity` is a request put back), the
router's decisions by outcome and its time from request in to worker accepted, the edge's TTFT
(HTTP request in → first chunk at the edge) and the workers' (engine start → first chunk), with
the TTFT histograms' buckets (where the tail is: the engines or the hops). A peer router's run
has its workers' series (their /metrics on the HTTP face: prefix-cache counters and requests
finished, no TTFT histogram), kept per worker (`worker_metrics`)."""


def fleet_series(text: str, out: dict[str, float]) -> dict[str, float]:
    """Add the FLEET_SERIES samples of one Prometheus text page to `out` (summed by the
    sample's name and labels over the pages)."""
    for line in text.splitlines():
        if line.startswith(FLEET_SERIES):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _scrape(targets: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for url in targets.values():
        try:
            with urllib.request.urlopen(url, timeout=5.0) as r:
                fleet_series(r.read().decode(), out)
        except OSError:
            continue
    return out


async def _tokenyard(args, bench: BenchConfig, logs: Path, env: dict[str, str] | None = None,
                    name: str = "tokenyard") -> dict[str, Any]:
    # router_args go on the queue's command line when the router runs in its process (the default)
    env = dict(env or {})
    if args.route_log:
        env["TOKENYARD_LOG_LEVEL"] = "debug"
    queue_log = logs / name / "queue.log"
    start = queue_log.stat().st_size if queue_log.exists() else 0
    worker_starts = [p.stat().st_size if p.exists() else 0
                     for p in (logs / name / f"worker-{i}.log" for i in range(args.workers))]
    fleet = FleetProcesses(workers=args.workers, profile=PROFILE, speed=args.speed, http_port=0,
                           router_policy=args.policy, log_dir=str(logs / name), extra_env=env,
                           edge_processes=_edge_processes(name, args),
                           router_args=["--flow-control", "off"] if name == "tokenyard-noflow" else [])
    async with fleet:
        bench.target = fleet.http_url
        res = await measured(bench, [("nats-server", fleet.server.proc), *fleet.procs])
        res["fleet_metrics"] = await asyncio.to_thread(_scrape, fleet.scrape_targets())
    if args.route_log:
        choices = route_choices(queue_log, start)
        res["route_choices"] = choice_summary(choices)
        placements(choices, res.get("requests", []))
        served = [x for i in range(args.workers)
                  for x in served_lines(logs / name / f"worker-{i}.log", worker_starts[i], f"w{i}")]
        engine_placements(served, res.get("requests", []), peer=False)
    return res


def _row(res: dict[str, Any], speed: float) -> dict[str, Any]:
    row = {k: res.get(k) for k in KEYS}
    for k in ("cpu_ms_per_request", "idle_cpu_ms_per_s", "fleet_metrics", "worker_metrics", "route_choices"):
        if k in res:
            row[k] = res[k]
    for k in TIME_KEYS:  # wall ms → simulated ms
        if row[k] is not None:
            row[k] = row[k] * speed
    row["requests"] = [{**r, **{k: round(r[k] * speed, 2) for k in WALL_MS if r.get(k) is not None}}
                       for r in res.get("requests", [])]
    return row


async def main_async(args) -> dict[str, Any]:
    logs = log_dir(args.log_dir, "live-router")
    base = args.base_rate or SYNTHETIC[args.workload].DEFAULT_RATE
    rows: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for load in args.loads:
            rate = base * load * args.speed * args.workers / 16
            for router in args.routers:
                bench = BenchConfig(workload=args.workload, num_prompts=args.num_prompts, rate=rate, seed=args.seed,
                                    progress=False, request_timeout_s=args.timeout, per_request=True)
                t, load_avg = time.monotonic(), os.getloadavg()[0]
                head = {"round": rnd, "router": router, "load": load, "rate": rate}
                try:
                    if router == "tokenyard":
                        res = await _tokenyard(args, bench, logs)
                    elif router == "tokenyard-ref":
                        with baseline_env(args.baseline) as env:
                            res = await _tokenyard(args, bench, logs, env, name=router)
                    elif router in ("tokenyard-1edge", "tokenyard-noflow"):
                        res = await _tokenyard(args, bench, logs, name=router)
                    else:
                        res = await _peer(router, args, bench, logs)
                except (FileNotFoundError, RuntimeError, TimeoutError) as e:
                    print(f"{router} ×{load}: skipped: {e}", file=sys.stderr)
                    rows.append({**head, "error": str(e)})
                    continue
                row = {**head, "wall_s": round(time.monotonic() - t, 1),
                       "load_avg": [round(load_avg, 1), round(os.getloadavg()[0], 1)], **_row(res, args.speed)}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "requests"}), flush=True)
    # the log folder is this machine's, not the result's: the record names none of its paths
    return {"config": {k: v for k, v in vars(args).items() if k not in ("func", "log_dir")}, "runs": rows}


def table(doc: dict[str, Any]) -> str:
    out = ["| round | load | router | load average (start → end) | completed | failed | TTFT p50 (ms) | TTFT p99 (ms) "
           "| TTFT mean (ms) | TPOT p99 (ms) | req/s |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        head = f"| {r.get('round', 1)} | ×{r['load']:g} | {r['router']}"
        if "error" in r:
            out.append(f"{head} | | — | — | skipped: {r['error']} | | | | |")
            continue
        start, end = r.get("load_avg", ("?", "?"))
        out.append(f"{head} | {start} → {end} | {r['completed']} | {r['failed']} | {r['median_ttft_ms']:.1f} | "
                   f"{r['p99_ttft_ms']:.1f} | {r['mean_ttft_ms']:.1f} | {r['p99_tpot_ms']:.1f} | {r['request_throughput']:.2f} |")
    return "\n".join(out)


def engine_ttft(fleet_metrics: dict[str, float]) -> tuple[float | None, list[int]]:
    """The workers' own mean TTFT (engine start → first chunk, wall s) and their request
    counts, least first, from their `vllm:time_to_first_token_seconds` series."""
    total = sum(v for k, v in fleet_metrics.items() if k.startswith("vllm:time_to_first_token_seconds_sum"))
    counts = sorted(int(v) for k, v in fleet_metrics.items() if k.startswith("vllm:time_to_first_token_seconds_count"))
    return (total / sum(counts) if sum(counts) else None), counts


def _grouped(ms: dict[str, float]) -> str:
    """`name v, …` with the edge's processes summed, then the fleet's total; '–' for none."""
    out: dict[str, float] = {}
    for k, v in ms.items():
        key = "edge" if k.startswith("edge") else k
        out[key] = out.get(key, 0.0) + v
    return ", ".join(f"{k} {v:.1f}" for k, v in out.items()) + f" (fleet {sum(out.values()):.1f})" if out else "–"


def breakdown(doc: dict[str, Any]) -> str:
    """Where each run's time and CPU went: the client's mean TTFT against the engines' own
    (their difference is what the router and its hops add, simulated ms), the requests each
    worker served, and each process group's CPU ms per request (the edge's processes summed)."""
    speed = doc["config"]["speed"]
    out = ["| round | load | router | TTFT mean | engine TTFT mean | difference | prefix hit ratio | "
           "requests per worker | CPU ms per request | idle CPU ms per s |", "|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in doc["runs"]:
        if "error" in r:
            continue
        fm = r.get("fleet_metrics", {})
        engine, counts = engine_ttft(fm)
        if not counts and r.get("worker_metrics"):  # a peer's workers: requests finished, by worker
            counts = sorted(int(sum(v for k, v in m.items() if k.startswith("vllm:request_success_total")))
                            for m in r["worker_metrics"].values())
        queries = sum(v for k, v in fm.items() if k.startswith("vllm:prefix_cache_queries_total"))
        hits = sum(v for k, v in fm.items() if k.startswith("vllm:prefix_cache_hits_total"))
        cpu: dict[str, float] = {}
        for k, v in (r.get("cpu_ms_per_request") or {}).items():
            key = "edge" if k.startswith("edge") else k
            cpu[key] = cpu.get(key, 0.0) + v
        engine_ms = None if engine is None else engine * 1000 * speed
        cells = [f"{r.get('round', 1)}", f"×{r['load']:g}", r["router"], f"{r['mean_ttft_ms']:.1f}",
                 "–" if engine_ms is None else f"{engine_ms:.1f}",
                 "–" if engine_ms is None else f"{r['mean_ttft_ms'] - engine_ms:.1f}",
                 f"{hits / queries:.3f}" if queries else "–",
                 " / ".join(map(str, counts)) or "–",
                 ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()) + (f" (fleet {sum(v for k, v in cpu.items() if k != 'client'):.1f})" if cpu else ""),
                 _grouped(r.get("idle_cpu_ms_per_s") or {})]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def sim_twin(workload: str, base_rate: float, load: float, speed: float, workers: int, num_prompts: int,
             seed: int) -> str:
    """The `tokenyard sim` command that replays a run's workload in simulated time: the bench
    hands the client its wall rate, and a synthetic workload's content follows its base rate
    (ChatBot's conversation slots are rate × 30 s), so the twin keeps that rate as the base
    (`--rate`) and speeds the clock up by 1 / speed (`--rate-scale`), on as many instances. Its
    workers heartbeat as the live ones do, every HEARTBEAT_INTERVAL_S of wall time, i.e. every
    0.1 × speed simulated seconds (`--heartbeat-s`): with the simulator's default 0.1 s the
    router sees a 4× staler fleet than live, and the default's ×3 median differs by 2 ms
    (docs/results-routing.md, round 11)."""
    rate = base_rate * load * speed * workers / 16
    return (f"tokenyard sim --workload {workload} --instances {workers} --profile {PROFILE} --rate {rate:g} "
            f"--rate-scale {1 / speed:g} --heartbeat-s {config.HEARTBEAT_INTERVAL_S * speed:g} "
            f"--num-requests {num_prompts} --seed {seed} --compare {DEFAULT_POLICY},sglang")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="simulated workers behind each router (default 4)")
    ap.add_argument("--speed", type=float, default=SPEED, help=f"simulated seconds per wall second (default {SPEED})")
    ap.add_argument("--workload", default="chatbot", choices=list(SYNTHETIC), help="default chatbot")
    ap.add_argument("--base-rate", type=float, default=None,
                    help="req/s of ×1 on 16 real-time instances (default: the workload's own)")
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 3.0],
                    help="multiples of the base rate (default 1,3)")
    ap.add_argument("--num-prompts", type=int, default=300, help="requests per run (default 300)")
    ap.add_argument("--routers", type=lambda s: s.split(","), default=["tokenyard", "sglang", "vllm"],
                    help="default tokenyard,sglang,vllm")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every (load, router) run this many times, interleaved: round 1's runs, then round 2's …")
    ap.add_argument("--policy", default=DEFAULT_POLICY, help=f"tokenyard's router policy (default {DEFAULT_POLICY})")
    ap.add_argument("--baseline", default=None, metavar="REF",
                    help="the commit router `tokenyard-ref` runs (the same fleet on REF's code: before / after)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the workload's requests and arrival times (default 0)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    ap.add_argument("--log-dir", default=None, help="every process's log (default: a new temporary folder, named on stderr)")
    ap.add_argument("--route-log", action="store_true",
                    help="tokenyard's router logs each choice (debug level: the hit and load of every worker); "
                         "the run keeps what its view expected against what it chose (`route_choices`); "
                         "a peer's workers log what they did with each request (its worker, hit and engine TTFT)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON to this file (default: not written)")
    args = ap.parse_args()
    ours = ("tokenyard", "tokenyard-1edge", "tokenyard-noflow", "tokenyard-ref")
    unknown = [r for r in args.routers if r not in ours and r not in PEERS]
    if unknown:
        ap.error(f"unknown router(s) {unknown}; known: {', '.join(ours)}, {', '.join(PEERS)}")
    if "tokenyard-ref" in args.routers and not args.baseline:
        ap.error("router tokenyard-ref needs --baseline REF")
    doc = asyncio.run(main_async(args))
    print(table(doc))
    print(breakdown(doc))
    if any("route_choices" in r for r in doc["runs"]):
        print(route_table(doc))
    base = args.base_rate or SYNTHETIC[args.workload].DEFAULT_RATE
    for load in args.loads:  # the same requests at the same simulated times, in the simulator
        print(f"×{load:g} in the simulator: " + sim_twin(args.workload, base, load, args.speed, args.workers,
                                                           args.num_prompts, args.seed))
    write_result(args.json, doc, prog="python -m bench.live_router")
    return 0


if __name__ == "__main__":
    sys.exit(main())
