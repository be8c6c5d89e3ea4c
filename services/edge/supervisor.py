"""`tokenyard edge --processes N` with N > 1: N edge processes on one HTTP port, started and
watched by this one (which serves no request itself and holds no NATS connection).

    children   `tokenyard edge … --processes 1 --reuse-port`, each with its own NATS connection,
               client lease and inbox subscription; SO_REUSEPORT lets the kernel spread the
               port's connections over them, so the edge streams on N cores, not one
    metrics    every child writes to one directory (prometheus_client's multiprocess mode);
               `/metrics` on the HTTP port, and on `--metrics-port` here, is the sum over them
    signals    SIGINT / SIGTERM go on to every child, which drains; this process exits once
               they have
    a death    reported on stderr with its exit code. During a child's first START_GRACE_S
               after the edge started it is a start-up failure (the port taken, a bad option):
               the others are stopped and this process exits with that code. Later the child
               is started again, after RESTART_DELAY_S · 2^(k-1) (at most RESTART_DELAY_MAX_S)
               for its k-th death in a row that came within STEADY_S of its start (one that
               lived STEADY_S starts the count again); the others are watched meanwhile. Its
               open requests are lost (their clients see the connection close; their workers'
               routers abort them when its lease lapses), the other children's keep streaming.
               Its metric files are folded (`fold_dead_process`): its counters and histograms
               added into one archive file per type, so the sums never go back, and its gauges
               dropped, so the directory holds the live children's files and one archive, not
               a file set per child ever started.

Each child dies with this process (shared.procs), so a SIGKILL here leaves no edge behind.
`tokenyard up --edge-processes N` runs this supervisor inside its own process, with its own
`spawn` (tokenyard/launcher.py): each child is one of its services, its stderr kept and its
death reported like any other's, and started again here.
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
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.mmap_dict import MmapedDict
from tokenyard.services.edge.shell import MULTIPROC_ENV, fold_lock, forget_dead_processes
from tokenyard.shared import config, janitor, metrics, natsutil
from tokenyard.shared.procs import die_with_parent

START_GRACE_S = natsutil.FIRST_CONNECT_TIMEOUT_S + 5.0
"""A child that exits sooner than this after its start failed to start: no restart. Longer than
a child's first NATS connection may take to fail (natsutil.FIRST_CONNECT_TIMEOUT_S) plus its
imports: an edge pointed at a NATS nobody runs exits this supervisor with the child's error,
instead of being started again every few seconds for ever."""
RESTART_DELAY_S = 1.0
"""The wait before a dead child is started again, doubled for each death in a row ..."""
RESTART_DELAY_MAX_S = 30.0
"""... up to this."""
STEADY_S = 10.0
"""A child that lived this long died of something new: its next restart waits RESTART_DELAY_S again."""
SUMMED_TYPES = ("counter", "histogram", "summary")
"""Metric files whose values add up over processes (a gauge's do not)."""


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen | None
    """None while it waits to be started again (at `due`)."""
    started: float
    deaths: int = 0
    """Its deaths in a row, each within STEADY_S of its start."""
    due: float = 0.0


def fold_dead_process(pid: int, path: str) -> None:
    """A gone process's metric files in `path` (prometheus_client's multiprocess directory):
    the values of its counters, histograms and summaries are added into `<type>_archive.db`
    (the collector reads it as one more process, so totals never go back), its gauges are
    dropped (a dead process's in-flight is not in flight), and its files are removed. One
    process folds (the supervisor): the archive has one writer; it folds under the directory's
    lock held exclusive (`fold_lock`), so a scrape sees the dead process either before the fold or
    after it, never half-way."""
    with fold_lock(path, exclusive=True):
        _fold(pid, path)


def _fold(pid: int, path: str) -> None:
    suffix = f"_{pid}.db"
    for name in os.listdir(path):
        if not name.endswith(suffix):
            continue
        file = os.path.join(path, name)
        kind = name.split("_", 1)[0]
        if kind in SUMMED_TYPES:
            try:
                values = list(MmapedDict.read_all_values_from_file(file))
            except FileNotFoundError:
                continue
            archive = MmapedDict(os.path.join(path, f"{kind}_archive.db"))
            try:
                for key, value, _timestamp, _pos in values:
                    archive.write_value(key, archive.read_value(key)[0] + value, 0.0)
            finally:
                archive.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)


class EdgeSupervisor:
    def __init__(self, child_cmd: list[str], processes: int, metrics_port: int | None = None,
                 metrics_host: str = "0.0.0.0", start_grace_s: float = START_GRACE_S,
                 clock: Callable[[], float] = time.monotonic,
                 spawn: Callable[[int, list[str], dict[str, str]], subprocess.Popen] | None = None) -> None:
        """`clock`: the time the restart waits are counted in (a test's own). `spawn(index, cmd,
        env)`: starts child `index` (a launcher's own, which keeps its stderr); None: a plain
        process that dies with this one."""
        if processes < 2:
            raise ValueError("a supervisor runs at least 2 edge processes")
        self.child_cmd = child_cmd
        self.processes = processes
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.start_grace_s = start_grace_s
        self.clock = clock
        self.spawn = spawn
        self.metrics_url: str | None = None
        self.restarts = 0
        self.dir = tempfile.mkdtemp(prefix="tokenyard-edge-metrics-")
        janitor.watch(self.dir)  # removed once this process has ended, however it ends
        self.env = {**os.environ, MULTIPROC_ENV: self.dir, "PYTHONMALLOC": os.environ.get("PYTHONMALLOC", "malloc")}
        self.env.pop(config.METRICS_PORT_ENV, None)  # the children's metrics are served here, summed
        self.children: list[_Child] = []
        self._started = self.clock()
        self.failed: int | None = None
        """The index of the child whose death in start-up stopped the edge (set before its
        siblings are stopped, whose exits follow: a launcher names this one, not them)."""

    def start_child(self, index: int, deaths: int = 0) -> _Child:
        """Start child `index` (`deaths`: its deaths in a row so far, for the restart backoff)."""
        if self.spawn is not None:
            proc = self.spawn(index, self.child_cmd, self.env)
        else:
            proc = subprocess.Popen(self.child_cmd, env=self.env, preexec_fn=die_with_parent())
        janitor.watch(pid=proc.pid)  # writes in self.dir: the sweeper waits for it
        return _Child(index, proc, self.clock(), deaths)

    def start_children(self) -> None:
        """Start the `processes` children; the start-up grace counts from now."""
        self.children = [self.start_child(i) for i in range(self.processes)]
        self._started = self.clock()

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
            if stop.is_set():  # asked to stop before it ran (a launcher stopping in start-up): start none
                return 0
            self.start_children()
            if self.metrics_port is not None:
                registry = CollectorRegistry()
                multiprocess.MultiProcessCollector(registry, self.dir)
                runner = await metrics.serve(registry, self.metrics_port, self.metrics_host)
                self.metrics_url = f"http://127.0.0.1:{metrics.bound_port(runner)}/metrics"
            while not stop.is_set():
                code = await self.reap()
                if code:
                    break
                try:
                    await asyncio.wait_for(stop.wait(), timeout=0.2)
                except TimeoutError:
                    pass
        finally:
            await self.stop_all()
            if runner is not None:
                await runner.cleanup()
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    async def reap(self) -> int:
        """One step of the supervision loop (`run` takes one every 0.2 s; public as the step
        tests drive on their own clock): handle the children that exited, and start those
        whose restart is due: 0 to go on, else the exit code to stop with."""
        now = self.clock()
        for i, child in enumerate(self.children):
            if child.proc is None:
                if now >= child.due:
                    self.children[i] = self.start_child(child.index, child.deaths)
                    self.restarts += 1
                continue
            if (rc := child.proc.poll()) is None:
                continue
            fold_dead_process(child.proc.pid, self.dir)
            if now - self._started < self.start_grace_s:
                self.failed = child.index
                self._say(f"edge process {child.index} exited with code {rc} during start-up; stopping")
                return rc if rc > 0 else 128 - rc if rc < 0 else 1  # killed by signal n: 128 + n, as a shell says
            deaths = child.deaths + 1 if now - child.started < STEADY_S else 1
            delay = min(RESTART_DELAY_MAX_S, RESTART_DELAY_S * 2 ** (deaths - 1))
            self._say(f"edge process {child.index} exited with code {rc}; starting it again in {delay:g} s")
            self.children[i] = _Child(child.index, None, child.started, deaths, due=now + delay)
        return 0

    async def stop_all(self, timeout_s: float = 35.0) -> None:
        """SIGTERM every child (each drains its streams, up to its shutdown timeout), then wait."""
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            if child.proc is None:
                continue
            while child.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        forget_dead_processes(self.dir)
