"""The fleet under the probes: real processes (`tokenyard up`'s FleetProcesses) on a real
nats-server, one that can be stopped and started again, and what the probes read of it
(which ids a worker runs, when each service answers again, each process's RSS)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter

import msgspec
from nats.aio.client import Client
from tokenyard.shared import nats_auth, natsutil, subjects

from tokenyard.launcher import FleetProcesses


def fleet_for(args, **kw) -> FleetProcesses:
    return FleetProcesses(workers=kw.pop("workers", 2), profile=args.profile, http_port=0,
                          log_dir=args.log_dir, **kw)


def proc(fleet: FleetProcesses, name: str) -> subprocess.Popen:
    return next(p for n, p in fleet.procs if n == name)


async def running_on(nc: Client, worker_id: str) -> set[str]:
    msg = await nc.request(subjects.worker_status(worker_id), b"", timeout=2)
    return set(msgspec.msgpack.decode(msg.data, type=list[str]))


def http_peers(pid: int, port: int) -> set[int]:
    """The client ports of the TCP connections to local `port` that process `pid` holds (its
    accepted HTTP connections: which front the kernel gave each client, under SO_REUSEPORT), or
    its children (an edge supervisor's edges)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids = [pid, *map(int, f.read().split())]
    inodes = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(f"/proc/{p}/fd/{fd}")).startswith("socket:["):
                        inodes.add(target[8:-1])
    peers = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                local, remote, inode = cols[1], cols[2], cols[9]
                remote_port = int(remote.rsplit(":", 1)[1], 16)
                if inode in inodes and int(local.rsplit(":", 1)[1], 16) == port and remote_port:  # not the listener
                    peers.add(remote_port)
    return peers


async def stop_process(p: subprocess.Popen | None, wait_s: float) -> None:
    """SIGTERM, up to `wait_s` for it to exit, then SIGKILL; nothing for a process already gone."""
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    for _ in range(round(wait_s / 0.05)):
        if p.poll() is not None:
            return
        await asyncio.sleep(0.05)
    p.kill()


def queue_replica(fleet: FleetProcesses, stderr, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Another replica of the fleet's queue process, started with the fleet's own command (so
    router and admission in its process or not, as there: a standby without the router the
    fleet's queue carries would ask `llm.v1.route` of nobody once that queue died), less its
    metrics ports (the fleet's queue holds them). `env`: more of its environment (another
    commit's code on PYTHONPATH, as the fleet's `extra_env`)."""
    own = list(proc(fleet, "queue").args)
    cmd = [a for i, a in enumerate(own) if not a.endswith("-metrics-port") and not own[i - 1].endswith("-metrics-port")]
    users = ("queue", "router", "admission", "edge")  # as the launcher's queue child (the others' permissions unused)
    return subprocess.Popen(cmd, env={**os.environ, **(env or {}), **nats_auth.child_env(fleet.nats_url, *users)},
                            stdout=subprocess.DEVNULL, stderr=stderr)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RestartableNats:
    """A nats-server on a fixed port and store dir that can be stopped and started again."""

    def __init__(self) -> None:
        self.port = natsutil.free_port()
        self.store = tempfile.mkdtemp(prefix="tokenyard-faults-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [natsutil.nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(400):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.025)
        raise TimeoutError("nats-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Answering:
    """When each service instance answers `$SRV.PING` again: a ping goes out every `every_s`
    to one inbox subscribed before the outage (nats-py resubscribes it on reconnect), and the
    first answer of each instance id after `since` is timed. An upper bound on each service's
    reconnect: it includes this probe's own reconnect and one ping interval."""

    def __init__(self, nc: Client, want: Counter, every_s: float = 0.05) -> None:
        self.nc, self.want, self.every_s = nc, want, every_s
        self.since = 0.0
        self.first: dict[str, tuple[str, float]] = {}
        self.all_back = asyncio.Event()

    async def subscribe(self) -> None:
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_reply)

    async def _on_reply(self, msg) -> None:
        if not self.since or not msg.data:
            return
        info = json.loads(msg.data)
        self.first.setdefault(info["id"], (info["name"], time.monotonic() - self.since))
        if not Counter(self.want - Counter(name for name, _ in self.first.values())):
            self.all_back.set()

    async def measure(self, timeout_s: float = 60.0) -> dict[str, float]:
        """From now (the server accepts connections again) until every instance answered:
        seconds to each kind's slowest instance, and `all` for the slowest of all."""
        self.since, self.first = time.monotonic(), {}

        async def ping() -> None:
            while not self.all_back.is_set():
                if self.nc.is_connected:
                    await self.nc.publish("$SRV.PING", b"", reply=self.inbox)
                await asyncio.sleep(self.every_s)
        pinger = asyncio.create_task(ping())
        try:
            async with asyncio.timeout(timeout_s):
                await self.all_back.wait()
        except TimeoutError:
            pass
        finally:
            pinger.cancel()
        by_kind: dict[str, float] = {}
        for name, s in self.first.values():
            kind = name.removeprefix("tokenyard-")
            by_kind[kind] = round(max(by_kind.get(kind, 0.0), s), 2)
        missing = self.want - Counter(name for name, _ in self.first.values())
        by_kind["all"] = round(max(s for _, s in self.first.values()), 2) if not missing else float("inf")
        return by_kind
