"""The edge supervisor's care of its children, with real processes: a child that keeps dying
is started again after a wait that doubles up to a cap and starts over once a child has
lived a while; a dead child's metric files are folded, so `/metrics` keeps its totals, drops
its gauges, and the directory does not grow with every child ever started."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

from prometheus_client import CollectorRegistry
from tokenyard.services.edge.shell import MULTIPROC_ENV, fold_lock, scrape
from tokenyard.services.edge.supervisor import (
    RESTART_DELAY_MAX_S,
    STEADY_S,
    EdgeSupervisor,
    fold_dead_process,
)
from tokenyard.shared import natsutil

from tests.test_edge_processes import sample


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_child_that_keeps_dying_is_restarted_after_a_doubling_capped_wait_reset_by_a_steady_life(capsys):
    clock = Clock()
    sup = EdgeSupervisor(["/bin/true"], processes=2, start_grace_s=0.0, clock=clock)
    sup.start_children()
    waits = []
    try:
        for _ in range(8):  # each death at once: 1, 2, 4, … s, at most RESTART_DELAY_MAX_S
            for child in sup.children:
                child.proc.wait()
            assert await sup.reap() == 0
            assert all(c.proc is None for c in sup.children)  # none started before its wait is over
            waits.append(sup.children[0].due - clock.now)
            clock.now = sup.children[0].due - 0.001
            assert await sup.reap() == 0 and all(c.proc is None for c in sup.children)
            clock.now += 0.001
            assert await sup.reap() == 0 and all(c.proc is not None for c in sup.children)
        assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, RESTART_DELAY_MAX_S, RESTART_DELAY_MAX_S, RESTART_DELAY_MAX_S]
        assert sup.restarts == 16
        clock.now += STEADY_S  # these lived a while before dying: the wait starts over
        for child in sup.children:
            child.proc.wait()
        await sup.reap()
        assert sup.children[0].due - clock.now == 1.0
        assert "exited with code 0; starting it again in 30 s" in capsys.readouterr().err
    finally:
        await sup.stop_all()


async def test_a_child_failing_at_the_edges_start_still_stops_it(tmp_path):
    sup = EdgeSupervisor([sys.executable, "-c", "import sys; sys.exit(4)"], processes=2)
    assert await sup.run(asyncio.Event()) == 4
    assert sup.restarts == 0


def test_a_dead_processs_metric_files_are_folded_totals_kept_gauges_dropped(tmp_path, monkeypatch):
    """Three processes wrote the directory; two die, one after the other. After each fold the
    sums are the same, the dead one's in-flight is gone, and its files are gone: the live
    process's files and one archive per summed type remain."""
    writer = (
        "import sys; from prometheus_client import Counter, Gauge, Histogram\n"
        "n = int(sys.argv[1])\n"
        "Counter('tokenyard:edge_requests', 'r', ['kind']).labels('a').inc(n)\n"
        "Histogram('tokenyard:edge_ttft_seconds', 't', buckets=(1.0,)).observe(0.5 * n)\n"
        "Gauge('tokenyard:edge_in_flight_requests', 'f', multiprocess_mode='livesum').set(n)\n"
        "print('ok', flush=True); sys.stdin.read()\n"
    )
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(n)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for n in (1, 2, 3)]
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    try:
        assert all(p.stdout.readline() == b"ok\n" for p in procs)
        live = 6.0
        for gone in procs[1:]:
            gone.kill()
            gone.wait()
            fold_dead_process(gone.pid, str(tmp_path))
            live -= float(procs.index(gone) + 1)
            text = scrape(CollectorRegistry()).decode()
            assert sample(text, 'tokenyard:edge_requests_total{kind="a"}') == 6.0
            assert sample(text, "tokenyard:edge_ttft_seconds_count") == 3.0
            assert sample(text, "tokenyard:edge_ttft_seconds_sum") == 3.0
            assert sample(text, 'tokenyard:edge_ttft_seconds_bucket{le="1.0"}') == 2.0  # 0.5 and 1.0
            assert sample(text, "tokenyard:edge_in_flight_requests") == live
            assert not [n for n in os.listdir(tmp_path) if n.endswith(f"_{gone.pid}.db")]
        assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".db")) == sorted([
            "counter_archive.db", "histogram_archive.db",
            f"counter_{procs[0].pid}.db", f"histogram_{procs[0].pid}.db", f"gauge_livesum_{procs[0].pid}.db"])
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_scrape_waits_while_a_dead_process_is_folded(tmp_path, monkeypatch):
    """The fold holds the directory's lock exclusive: a scrape started meanwhile (another edge
    process serving /metrics) reads only once the fold is done, never a file listed and then
    gone (prometheus_client raises on that) nor a folded process counted twice."""
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    done = threading.Event()
    pages = []
    with fold_lock(str(tmp_path), exclusive=True):
        reader = threading.Thread(target=lambda: (pages.append(scrape(CollectorRegistry())), done.set()))
        reader.start()
        assert not done.wait(0.3)  # held back by the fold
    assert done.wait(10)
    reader.join()
    assert pages == [b""]  # nothing written in this directory yet: an empty page, not an error


async def test_a_supervisor_asked_to_stop_before_it_runs_starts_no_child():
    """`up` stopping while its edge supervisor's task has not run yet (main: it started every
    child, then stopped them)."""
    spawned = []

    def spawn(index, cmd, env):
        spawned.append(index)
        return subprocess.Popen(["sleep", "30"])

    stop = asyncio.Event()
    stop.set()
    sup = EdgeSupervisor(["sleep", "30"], processes=2, spawn=spawn)
    assert await sup.run(stop) == 0
    assert spawned == [] and sup.children == []
    assert not os.path.exists(sup.dir)


async def test_a_child_that_fails_its_first_nats_connection_stops_the_edge_instead_of_restarting():
    """An edge pointed at a NATS nobody runs: each child gives up its first connection after
    natsutil.FIRST_CONNECT_TIMEOUT_S (10 s) and exits 1. That is still start-up, so the supervisor
    exits with the child's code; with the grace as long as the connect bound (round 8) such a death
    counted as a crash and the children were started again every few seconds for ever."""
    clock = Clock()
    sup = EdgeSupervisor([sys.executable, "-c", "import sys; sys.exit(1)"], processes=2, clock=clock)
    sup.start_children()
    try:
        for child in sup.children:
            child.proc.wait()
        clock.now += natsutil.FIRST_CONNECT_TIMEOUT_S + 1.0  # the connect's bound, and the imports
        assert await sup.reap() == 1
        assert sup.restarts == 0 and sup.failed == 0
    finally:
        await sup.stop_all()
