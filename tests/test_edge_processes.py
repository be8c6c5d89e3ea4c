"""Several edge processes on one HTTP port (`tokenyard edge --processes N`,
services/edge/supervisor.py): each registers and serves; `/metrics` is the sum over them,
without the in-flight gauge of one that is gone; a child that dies after start-up is started
again, one that fails at start-up stops the edge with its code; SIGTERM drains and stops every
child; a SIGKILLed supervisor leaves none behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from tokenyard.services.edge import cli as edge_cli
from tokenyard.services.edge.shell import MULTIPROC_ENV, scrape
from tokenyard.services.edge.supervisor import EdgeSupervisor
from tokenyard.shared import config, nats_auth, natsutil
from tokenyard.shared.procs import die_with_parent

from tests.conftest import start_inproc_fleet, until
from tests.test_fleet_processes import alive, descendants
from tokenyard.launcher import ping


@given(cpus=st.integers(min_value=1, max_value=512), quota=st.one_of(st.none(), st.integers(1, 64 * 100_000)))
def test_the_default_is_one_process_per_cpu_capped(tmp_path_factory, cpus, quota):
    """One per CPU of the affinity mask, fewer under a cgroup CPU quota (rounded up), at most
    EDGE_MAX_PROCESSES, at least 1."""
    cpu_max = tmp_path_factory.mktemp("cg") / "cpu.max"
    cpu_max.write_text(f"{quota if quota else 'max'} 100000\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
        limit = cpus if quota is None else min(cpus, -(-quota // 100_000))
        assert config.edge_processes(str(cpu_max)) == min(limit, config.EDGE_MAX_PROCESSES)
        assert config.edge_processes(str(tmp_path_factory.getbasetemp() / "none")) == min(cpus, config.EDGE_MAX_PROCESSES)


def sample(text: str, name: str) -> float | None:
    """The value of one Prometheus sample line `name value` (labels included in `name`)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_gone_process_leaves_its_totals_but_not_its_in_flight(tmp_path, monkeypatch):
    """Two processes wrote the shared directory: one still runs, one exited. Summed: both
    counters (totals never go back), only the live one's in-flight gauge."""
    writer = (
        "import sys; from prometheus_client import Counter, Gauge\n"
        "Counter('tokenyard:edge_requests', 'r').inc(int(sys.argv[1]))\n"
        "Gauge('tokenyard:edge_in_flight_requests', 'f', multiprocess_mode='livesum').set(int(sys.argv[1]))\n"
        "print('ok', flush=True); sys.stdin.read()\n"
    )
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    live = subprocess.Popen([sys.executable, "-c", writer, "3"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    gone = subprocess.Popen([sys.executable, "-c", writer, "5"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline() == b"ok\n" and gone.stdout.readline() == b"ok\n"
        monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
        text = scrape(CollectorRegistry()).decode()
        assert sample(text, "tokenyard:edge_requests_total") == 8.0
        assert sample(text, "tokenyard:edge_in_flight_requests") == 8.0
        gone.kill()
        gone.wait()
        text = scrape(CollectorRegistry()).decode()
        assert sample(text, "tokenyard:edge_requests_total") == 8.0
        assert sample(text, "tokenyard:edge_in_flight_requests") == 3.0
    finally:
        for p in (live, gone):
            p.kill()
            p.wait()


async def _generate(url: str, n: int) -> None:
    """`n` requests, each on a connection of its own (so the kernel spreads them)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for i in range(n):
            body = {"model": config.DEFAULT_MODEL, "prompt": f"p{i}", "max_tokens": 2}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["usage"]["completion_tokens"] == 2


async def _served_by_each(nc) -> list[float]:
    """Finished completions per edge process (each one's `$SRV.STATS`)."""
    out = []
    for info in await natsutil.gather_replies(nc, "$SRV.STATS.tokenyard-edge", 0.5):
        data = next(e["data"] for e in info["endpoints"] if e.get("data"))
        out.append(data["requests"].get("completions,finished", 0.0))
    return sorted(out)


def _edge_env(url: str) -> dict[str, str]:
    return {**os.environ, **nats_auth.child_env(url, "edge")}


async def _edges_up(nc, n: int) -> None:
    async with asyncio.timeout(180):  # processes starting at nice 19 on a loaded host
        while (await ping(nc))["tokenyard-edge"] < n:
            await asyncio.sleep(0.1)


async def test_processes_share_the_port_and_sum_their_metrics(nats_server):
    fleet = await start_inproc_fleet(nats_server.url, workers=1)
    nc = await natsutil.connect(nats_server.url, "test")
    before = (await ping(nc))["tokenyard-edge"]
    port = natsutil.free_port()
    stop = asyncio.Event()
    cmd = edge_cli.child_command(nats_server.url, "127.0.0.1", port, [config.DEFAULT_MODEL])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", _edge_env(nats_server.url))
        sup = EdgeSupervisor(cmd, 2, metrics_port=0, metrics_host="127.0.0.1")
    run = asyncio.create_task(sup.run(stop))
    try:
        await _edges_up(nc, before + 2)
        await _generate(f"http://127.0.0.1:{port}", 24)
        served = await _served_by_each(nc)
        assert sum(served) == 24 and len([s for s in served if s]) == 2  # both took connections
        async with aiohttp.ClientSession() as http:
            for url in (f"http://127.0.0.1:{port}/metrics", sup.metrics_url):  # either process, or the supervisor
                async with http.get(url) as resp:
                    text = await resp.text()
                assert sample(text, 'tokenyard:edge_requests_total{endpoint="completions",outcome="finished"}') == 24
                assert sample(text, "tokenyard:edge_in_flight_requests") == 0.0
                assert sample(text, 'tokenyard:edge_ttft_seconds_count{endpoint="completions"}') == 24
    finally:
        stop.set()
        assert await run == 0
        await fleet.stop()
    assert all(c.proc.returncode == 0 for c in sup.children)  # each drained and exited cleanly
    assert not os.path.exists(sup.dir)
    await nc.drain()


async def test_a_child_that_dies_is_started_again_and_the_port_keeps_serving(nats_server):
    fleet = await start_inproc_fleet(nats_server.url, workers=1)
    nc = await natsutil.connect(nats_server.url, "test")
    before = (await ping(nc))["tokenyard-edge"]
    port = natsutil.free_port()
    cmd = edge_cli.child_command(nats_server.url, "127.0.0.1", port, [config.DEFAULT_MODEL])
    stop = asyncio.Event()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", _edge_env(nats_server.url))
        sup = EdgeSupervisor(cmd, 2, start_grace_s=0.0)
    run = asyncio.create_task(sup.run(stop))
    try:
        await _edges_up(nc, before + 2)
        first = sup.children[0].proc
        first.kill()
        # A connection the kernel queued on the dying process's socket is reset with it (the
        # SO_REUSEPORT group keeps it until its last descriptor closes): wait for the exit.
        await until(lambda: first.poll() is not None, timeout_s=10)
        await _generate(f"http://127.0.0.1:{port}", 6)  # the other one takes every connection meanwhile
        await until(lambda: sup.restarts == 1, timeout_s=30)
        assert sup.children[0].proc is not first
        assert not [n for n in os.listdir(sup.dir) if n.endswith(f"_{first.pid}.db")]  # folded, not kept
        await _edges_up(nc, before + 2)
        await _generate(f"http://127.0.0.1:{port}", 6)
    finally:
        stop.set()
        assert await run == 0
        await fleet.stop()
    await nc.drain()


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "another-fleets-edges"])
async def test_a_taken_port_is_refused_before_any_edge_process_starts(nats_server, shared):
    """Held by anything, even by another fleet's edge processes (which bind with SO_REUSEPORT,
    so this one's children would bind beside them and the kernel would split the port's
    connections between two fleets): exit 1, saying so, nothing started."""
    with socket.socket() as taken:
        if shared:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "tokenyard.cli", "edge", "--nats", nats_server.url,
               "--http-port", str(port), "--processes", "2"]
        proc = await asyncio.create_subprocess_exec(*cmd, env=_edge_env(nats_server.url),
                                                    stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(120):
            _, err = await proc.communicate()
    assert proc.returncode == 1
    assert f"tokenyard edge: port {port} is in use" in err.decode()
    assert "edge process" not in err.decode()  # no child was started


async def test_a_child_failing_at_start_up_stops_the_edge_with_its_code(tmp_path):
    from tokenyard.services.edge.supervisor import EdgeSupervisor

    sup = EdgeSupervisor([sys.executable, "-c", "import sys; sys.exit(3)"], processes=2)
    async with asyncio.timeout(60):
        assert await sup.run(asyncio.Event()) == 3
    assert all(c.proc.poll() is not None for c in sup.children)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_children_die_with_a_killed_supervisor(nats_server):
    nc = await natsutil.connect(nats_server.url, "test")
    before = (await ping(nc))["tokenyard-edge"]
    cmd = [sys.executable, "-m", "tokenyard.cli", "edge", "--nats", nats_server.url, "--http-port", "0",
           "--processes", "2"]
    sup = subprocess.Popen(cmd, env=_edge_env(nats_server.url), preexec_fn=die_with_parent())
    try:
        await _edges_up(nc, before + 2)
        children = descendants(sup.pid)
        assert len(children) == 2
        sup.send_signal(signal.SIGKILL)
        sup.wait()
        await until(lambda: not any(alive(p) for p in children), timeout_s=60, poll_s=0.1)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    await nc.drain()
