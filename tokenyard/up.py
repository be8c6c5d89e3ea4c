"""`tokenyard up`: its command line — flags, the checks made before anything starts, the local
creds it leaves for clients on this machine — around `launcher.FleetProcesses`, which starts
and watches the processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from tokenyard.launcher import NATS_PORT, ROUTER_PLACES, FleetProcesses, nats_port
from tokenyard.services.router.core import DEFAULT_POLICY
from tokenyard.shared import config, janitor, nats_auth, natsutil


def register(sub) -> None:
    from tokenyard.services.router.core import POLICIES
    from tokenyard.services.worker.sim.engine_policies import ENGINE_POLICIES
    from tokenyard.services.worker.sim.latency import PROFILES

    p = sub.add_parser(
        "up", help="start nats-server and every service as processes",
        description="Bring a whole fleet up on this machine: a NATS server; the queue, with the HTTP edge, "
        "admission and the router in its process (each asked by a call); the macro-instance controller; N workers. "
        "Ctrl-C drains and stops everything.",
    )
    p.add_argument("--workers", type=int, default=2, help="engine instances to start (at least 1)")
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="sim: the simulated engine; vllm: vLLM itself, --model is the model's path (also the name served)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="a100-llama3-8b",
                   help="GPU and model the simulated engine behaves like")
    p.add_argument("--speed", type=float, default=1.0,
                   help="the simulated GPUs run this many times as fast as the profile (2 = twice as fast as the real "
                        "GPU, 0.1 = ten times slower) and report the costs they run at")
    p.add_argument("--scheduling", choices=ENGINE_POLICIES, default="vllm",
                   help="the simulated workers' scheduling policy (default vllm: vLLM V1's priority order; "
                   "scorpio: SCORPIO's TPOT-aware batching and deadline rejection)")
    p.add_argument("--nats", metavar="URL", default=None, help="use this NATS server instead of starting one")
    p.add_argument("--nats-port", type=int, default=None,
                   help=f"port of the NATS server to start (default: {NATS_PORT} if free, else any free port)")
    p.add_argument("--no-nats-auth", action="store_true",
                   help="start nats-server open to anyone (default: a user per service kind, see docs/security.md)")
    p.add_argument("--nats-creds-dir", default=None, help="write the generated creds files here (default: a temp dir)")
    p.add_argument("--nats-tls-cert", default=None, help="serve NATS over TLS with this certificate (PEM; with --nats-tls-key)")
    p.add_argument("--nats-tls-key", default=None, help="the certificate's private key (PEM)")
    p.add_argument("--nats-cluster", type=int, default=0, metavar="N",
                   help="start N nats-servers clustered over loopback routes (JetStream R3) instead of one")
    p.add_argument("--http-port", type=int, default=8000, help="port of the OpenAI-compatible HTTP API")
    p.add_argument("--edge-processes", type=int, default=0, metavar="N",
                   help="edge processes of their own serving the HTTP port together, to scale the HTTP front "
                        "apart (default 0: the edge runs in the queue's process and hands each request to admission "
                        f"by a call; with --admission separate, one per CPU, at most {config.EDGE_MAX_PROCESSES}: "
                        f"{config.edge_processes()} here)")
    p.add_argument("--policy", choices=list(POLICIES), default=DEFAULT_POLICY,
                   help=f"how the router picks a worker (default {DEFAULT_POLICY})")
    p.add_argument("--router", choices=ROUTER_PLACES, default="in-queue",
                   help="in-queue: the router runs in the queue's process, asked by a call (one NATS crossing fewer "
                        "per request); separate: its own process, on llm.v1.route")
    p.add_argument("--admission", choices=ROUTER_PLACES, default="in-queue",
                   help="in-queue: admission runs in the queue's process and hands it each request at once, while "
                        "JetStream stores it (one NATS crossing fewer per request); separate: its own process")
    p.add_argument("--macro-size", type=int, default=4, help="workers per macro-instance")
    p.add_argument("--macro-mode", choices=("nodg", "ecoserve"), default="nodg",
                   help="nodg: every worker takes prefill and decode; ecoserve: workers of a macro-instance "
                   "take turns at prefill")
    p.add_argument("--macro-scale", action="store_true",
                   help="let the macro-instance controller start and stop worker processes with the load")
    p.add_argument("--model", default=config.DEFAULT_MODEL, help="model name served (with --engine vllm: its path)")
    p.add_argument("--log-dir", default=None, help="write each service's log here (default: keep only the last lines)")
    p.add_argument("--tenants", metavar="FILE.toml",
                   help="admission's tenant policies (services/admission/tenants.py): e.g. which tenants may ask for P0")
    p.add_argument("--prometheus-config", metavar="PATH",
                   help="write a prometheus.yml that scrapes every service of this fleet")
    p.add_argument("--bench-prompts", type=int, default=0,
                   help="once up, run `bench serve` with this many prompts against the HTTP API, then stop (0: keep running)")
    p.add_argument("--bench-rate", type=float, default=20.0, help="requests/s of that benchmark")
    p.set_defaults(func=main)


def main(args) -> int:
    return asyncio.run(run_up(args))


def macro_args(args) -> list[str]:
    """The macro-instance's command-line options that `up`'s own options imply."""
    out = ["--mode", args.macro_mode]
    if args.macro_scale:
        out += ["--scale", "--worker-engine", args.engine, "--worker-profile", args.profile,
                "--worker-speed", str(args.speed), "--worker-model", args.model,
                "--worker-scheduling", args.scheduling]
    return out


def _tls(args) -> nats_auth.TlsFiles | None:
    if bool(args.nats_tls_cert) != bool(args.nats_tls_key):
        raise SystemExit("--nats-tls-cert and --nats-tls-key go together")
    return nats_auth.TlsFiles(args.nats_tls_cert, args.nats_tls_key, getattr(args, "nats_tls_ca", None) or "") if args.nats_tls_cert \
        else None


def _refusal(args) -> str | None:
    if args.engine == "vllm" and args.model == config.DEFAULT_MODEL:
        return "--engine vllm needs --model PATH (the model's local path)"
    if args.workers < 1:
        return "--workers must be at least 1: a fleet without workers cannot serve a request"
    if not args.speed > 0:
        return "--speed must be > 0"
    if args.macro_size < 1:
        return "--macro-size must be at least 1"
    if args.edge_processes < 0:
        return "--edge-processes must be at least 0"
    if args.tenants and not os.path.isfile(args.tenants):
        return f"--tenants: no such file: {args.tenants}"
    if args.http_port and natsutil.port_taken("127.0.0.1", args.http_port):  # edges share theirs (SO_REUSEPORT)
        return f"--http-port {args.http_port} is in use"
    return None


def leave_local_creds(fleet: FleetProcesses) -> str | None:
    """Copy the `client` and `observer` creds where this machine's commands look
    (nats_auth.local_creds), 0600; the `client` copy's path."""
    auth = fleet.server.auth if fleet.server is not None else None
    if auth is None or nats_auth.local_client_creds(fleet.nats_url) is None:
        return None
    for user in nats_auth.LOCAL_USERS:
        local = nats_auth.local_creds(fleet.nats_url, user)
        local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(auth.path(user).read_bytes())
        janitor.watch(str(local))  # gone even if `up` is killed outright (else at its stop, below)
    return str(nats_auth.local_client_creds(fleet.nats_url))


def remove_local_creds(url: str) -> None:
    """Undo `leave_local_creds`, the folder too once empty (one a port ever used piled up)."""
    if nats_auth.local_client_creds(url) is None:
        return
    for user in nats_auth.LOCAL_USERS:
        nats_auth.local_creds(url, user).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: someone else's file is there
        nats_auth.local_client_creds(url).parent.rmdir()


async def run_up(args) -> int:
    """`tokenyard up` with its parsed options: the exit code (2: options refused)."""
    if (why := _refusal(args)) is not None:
        print(f"tokenyard up: error: {why}", file=sys.stderr)
        return 2
    port = 0 if args.nats else nats_port(args.nats_port)
    fleet = FleetProcesses(
        workers=args.workers, engine=args.engine, profile=args.profile, speed=args.speed,
        scheduling=args.scheduling, nats_url=args.nats, nats_port=port, nats_cluster=args.nats_cluster, http_port=args.http_port,
        router_policy=args.policy, router=args.router, admission=args.admission, macro_size=args.macro_size, model=args.model, log_dir=args.log_dir,
        ready_timeout_s=300.0 if args.engine == "vllm" else 60.0,  # a vLLM engine starts in 15-60 s
        macro_args=macro_args(args), tenants=args.tenants, nats_secure=not args.no_nats_auth,
        creds_dir=args.nats_creds_dir, nats_tls=_tls(args),
        edge_processes=args.edge_processes,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await fleet.start()
    except (RuntimeError, TimeoutError, ConnectionError, OSError) as e:
        print(f"tokenyard up: error: {e}", file=sys.stderr)
        return 1
    try:
        print(f"tokenyard is up: {args.workers} {args.engine} worker(s), profile {args.profile}, speed {args.speed}")
        taken = "" if args.nats or args.nats_cluster > 1 or args.nats_port is not None or port == NATS_PORT \
            else f"   ({NATS_PORT} was taken)"
        print(f"  NATS     {fleet.nats_url}   (requests on llm.v1.submit; try `tokenyard request`){taken}")
        if args.nats_cluster > 1:
            print(f"           a cluster of {args.nats_cluster} nodes; stream and buckets replicated R"
                  f"{min(3, args.nats_cluster)}")
        if fleet.client_creds:
            local = leave_local_creds(fleet)
            print(f"  creds    {nats_auth.CREDS_ENV}={fleet.client_creds}   (the `client` user"
                  + (f"; clients on this machine find it in {local})" if local else ")"))
        print(f"  HTTP     {fleet.http_url}/v1   (OpenAI-compatible; /metrics, /health ready, /live)")
        print(f"  model    {args.model}")
        for name, url in fleet.scrape_targets().items():
            print(f"  metrics  {name:<10} {url}")
        if args.prometheus_config:
            from tokenyard.shared.metrics import prometheus_config

            with open(args.prometheus_config, "w") as f:
                f.write(prometheus_config(fleet.scrape_targets()))
            print(f"  prometheus --config.file {args.prometheus_config}")
        sys.stdout.flush()
        if args.bench_prompts:
            from tokenyard.loadgen.serve import BenchConfig, print_result, run_bench

            result = await run_bench(BenchConfig(
                target=fleet.http_url, num_prompts=args.bench_prompts, rate=args.bench_rate, model=args.model,
            ))
            print_result(result)
            return 0 if result.get("failed", 1) == 0 else 1
        print("Ctrl-C stops everything.", flush=True)
        stopped = asyncio.create_task(stop.wait())
        while True:  # report each service that dies; the others keep serving
            crashed = asyncio.create_task(fleet.next_exit())
            await asyncio.wait({stopped, crashed}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                crashed.cancel()
                return 0
            print(f"tokenyard up: {crashed.result()}", file=sys.stderr, flush=True)
    finally:
        print("stopping: draining services …", flush=True)
        if fleet.client_creds:
            remove_local_creds(fleet.nats_url)
        await fleet.stop()
