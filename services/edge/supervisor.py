"""`tokenyard edge --processes N` with N > 1: N edge processes on one HTTP port, started and
watched by this one (which serves no request itself and holds no NATS connection).

    children   `tokenyard edge … --processes 1 --reuse-port`, each with its own NATS connection,
               client lease and inbox subscription; SO_REUSEPORT lets the kernel spread the
               port's connections over them, so the edge streams on N cores, not one
    metrics    every child writes to one directory (prometheus_client's multiprocess mode);
               `/metrics` on the HTTP port, and on `--metrics-port` here, is the sum over them
    signals    SIGINT / SIGTERM go on to every child, which drains; this process exits once
               they have
    a death    reported on stderr with its exit code. During a child's first START_GRACE_S it
               is a start-up failure (the port taken, a bad option): the others are stopped and
               this process exits with that code. Later the child is started again after
               RESTART_DELAY_S; its open requests are lost (their clients see the connection
               close; their workers' routers abort them when its lease lapses), the other
               children's keep streaming.

Each child dies with this process (shared.procs), so a SIGKILL here leaves no edge behind.
`tokenyard up --edge-processes N` starts the same children itself (tokenyard/launcher.py), so
it reports each like any other service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, multiprocess
from tokenyard.services.edge.shell import MULTIPROC_ENV, forget_dead_processes
from tokenyard.shared import config, metrics
from tokenyard.shared.procs import die_with_parent

START_GRACE_S = 10.0
"""A child that exits sooner than this after its start failed to start: no restart."""
RESTART_DELAY_S = 1.0


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen
    started: float


class EdgeSupervisor:
    def __init__(self, child_cmd: list[str], processes: int, metrics_port: int | None = None,
                 metrics_host: str = "0.0.0.0", start_grace_s: float = START_GRACE_S) -> None:
        if processes < 2:
            raise ValueError("a supervisor runs at least 2 edge processes")
        self.child_cmd = child_cmd
        self.processes = processes
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.start_grace_s = start_grace_s
        self.metrics_url: str | None = None
        self.restarts = 0
        self.dir = tempfile.mkdtemp(prefix="tokenyard-edge-metrics-")
        self.env = {**os.environ, MULTIPROC_ENV: self.dir, "PYTHONMALLOC": os.environ.get("PYTHONMALLOC", "malloc")}
        self.env.pop(config.METRICS_PORT_ENV, None)  # the children's metrics are served here, summed
        self.children: list[_Child] = []

    def _spawn(self, index: int) -> _Child:
        proc = subprocess.Popen(self.child_cmd, env=self.env, preexec_fn=die_with_parent())
        return _Child(index, proc, time.monotonic())

    def _say(self, text: str) -> None:
        print(f"tokenyard edge: {text}", file=sys.stderr, flush=True)

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Serve until `stop` is set (default: until SIGINT / SIGTERM); the exit code."""
        if stop is None:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        runner = None
        code = 0
        try:
            self.children = [self._spawn(i) for i in range(self.processes)]
            if self.metrics_port is not None:
                registry = CollectorRegistry()
                multiprocess.MultiProcessCollector(registry, self.dir)
                runner = await metrics.serve(registry, self.metrics_port, self.metrics_host)
                self.metrics_url = f"http://127.0.0.1:{metrics.bound_port(runner)}/metrics"
            while not stop.is_set():
                code = await self._reap()
                if code:
                    break
                try:
                    await asyncio.wait_for(stop.wait(), timeout=0.2)
                except TimeoutError:
                    pass
        finally:
            await self._stop_all()
            if runner is not None:
                await runner.cleanup()
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    async def _reap(self) -> int:
        """Handle the children that exited: 0 to go on, else the exit code to stop with."""
        for i, child in enumerate(self.children):
            if (rc := child.proc.poll()) is None:
                continue
            with contextlib.suppress(FileNotFoundError):  # a child's scrape may have dropped it first
                multiprocess.mark_process_dead(child.proc.pid, self.dir)
            if time.monotonic() - child.started < self.start_grace_s:
                self._say(f"edge process {child.index} exited with code {rc} during start-up; stopping")
                return rc if rc > 0 else 128 - rc if rc < 0 else 1  # killed by signal n: 128 + n, as a shell says
            self._say(f"edge process {child.index} exited with code {rc}; starting it again")
            await asyncio.sleep(RESTART_DELAY_S)
            self.children[i] = self._spawn(child.index)
            self.restarts += 1
        return 0

    async def _stop_all(self, timeout_s: float = 35.0) -> None:
        """SIGTERM every child (each drains its streams, up to its shutdown timeout), then wait."""
        for child in self.children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            while child.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        forget_dead_processes(self.dir)
