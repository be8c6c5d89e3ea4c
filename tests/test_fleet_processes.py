"""The fleet as `tokenyard up` runs it: every service its own OS process on a real
nats-server, discovered through `$SRV.PING`, one request over NATS and one over HTTP, then a
clean stop (every process drains and exits 0); a service that fails at start-up named with its
own last lines; no orphans when `up` is killed outright; no fleet without workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from tokenyard.shared import janitor, natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tokenyard import cli, launcher
from tokenyard.launcher import NATS_PORT, FleetProcesses, nats_port, ping


# router: in the queue's process, or its own; edges: 0, the edge in the queue's process (up's default), or N of their own
@pytest.mark.parametrize(("router", "edges"), [("in-queue", 0), ("in-queue", 2), ("separate", 1)])
async def test_fleet_of_processes_serves_nats_and_http(tmp_path, router, edges):
    fleet = FleetProcesses(workers=2, profile="zero", http_port=0, log_dir=str(tmp_path), router=router,
                           edge_processes=edges)
    await fleet.start()
    procs = list(fleet.procs)
    try:
        nc = await natsutil.connect(fleet.nats_url, "test")
        assert await ping(nc) == fleet.expected()

        client = TokenyardClient(nc)
        done = await client.generate(schemas.GenerateRequest(prompt="over nats", max_tokens=4))
        assert done.finish_reason == "length" and done.usage.completion_tokens == 4
        assert done.worker_id in ("w0", "w1")
        await client.close()  # its lease task ends with it
        await nc.drain()

        async with aiohttp.ClientSession() as http:
            body = {"model": "tokenyard-sim", "prompt": "over http", "max_tokens": 3, "stream": True}
            async with http.post(f"{fleet.http_url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                lines = [ln.decode().strip() async for ln in resp.content if ln.strip()]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len("".join(c["choices"][0]["text"] for c in chunks if c["choices"])) == 3  # 3 one-byte tokens
    finally:
        await fleet.stop()
    assert {name: p.returncode for name, p in procs} == {name: 0 for name, _ in procs}


async def test_stop_tells_each_process_once_the_edges_through_their_supervisor(monkeypatch):
    """`stop()` SIGTERMs every service once: the edge processes by their supervisor only. Told
    a second time late in its shutdown (its event loop closed, Python's default handler back),
    an edge process died of it, exit code -15 (seen in a CI run)."""
    fleet = FleetProcesses(workers=1, profile="zero", http_port=0, edge_processes=2, ready_timeout_s=180)
    await fleet.start()
    procs = list(fleet.procs)
    told: list[tuple[int, int]] = []
    real = subprocess.Popen.send_signal

    def send_signal(self, sig):
        told.append((self.pid, sig))
        return real(self, sig)

    monkeypatch.setattr(subprocess.Popen, "send_signal", send_signal)
    await fleet.stop()
    terms = Counter(pid for pid, sig in told if sig == signal.SIGTERM)
    assert {name: terms[p.pid] for name, p in procs} == {name: 1 for name, _ in procs}
    assert {name: p.returncode for name, p in procs} == {name: 0 for name, _ in procs}


async def test_a_service_failing_at_start_up_is_named_with_its_last_lines():
    """The edge cannot bind its HTTP port: `up` says which service failed and why, in the
    service's own words (not a traceback: a one-line error)."""
    def nats_client_tasks() -> set[asyncio.Task]:
        return {t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("Client.")}

    before = nats_client_tasks()  # an earlier test's connections, if any, are not this one's
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fleet = FleetProcesses(workers=1, profile="zero", http_port=taken.getsockname()[1], edge_processes=2)
        with pytest.raises(RuntimeError) as err:
            await fleet.start()
    text = str(err.value)
    assert re.match(r"during start-up, edge-[01] exited with code 1; its last lines:", text)
    assert "tokenyard edge: error:" in text and "address already in use" in text
    assert "Traceback" not in text
    assert fleet.procs == []  # everything started was stopped
    # ... and its own NATS connection closed: left open to the stopped server, it would
    # reconnect forever in this event loop (and hang the test session's teardown).
    await until(lambda: not nats_client_tasks() - before, timeout_s=5)


async def test_the_edge_that_failed_at_start_up_is_named_not_the_sibling_stopped_after_it(monkeypatch):
    """Edge process 1 fails at once; the supervisor then stops edge 0. Main named whichever
    exit it saw first in its list: edge-0, exit code 0 or -15, and edge 0's lines."""

    class OneFails(launcher.EdgeSupervisor):
        def start_child(self, index: int, deaths: int = 0):
            if index == 1:
                self.child_cmd, good = [sys.executable, "-c", "import sys; print('edge 1 is broken', file=sys.stderr); sys.exit(3)"], self.child_cmd
                try:
                    return super().start_child(index, deaths)
                finally:
                    self.child_cmd = good
            return super().start_child(index, deaths)

    monkeypatch.setattr(launcher, "EdgeSupervisor", OneFails)
    fleet = FleetProcesses(workers=0, profile="zero", http_port=0, edge_processes=2, metrics=False)
    with pytest.raises(RuntimeError) as err:
        await fleet.start()
    text = str(err.value)
    assert text.startswith("during start-up, edge-1 exited with code 3; its last lines:"), text
    assert "edge 1 is broken" in text
    assert fleet.procs == []


def descendants(pid: int) -> set[int]:
    """The processes under `pid` that die with it: not shared/janitor.py's sweeper, which outlives
    its parent on purpose (to remove what the parent leaves) and ends once it has."""
    out: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # the process ended meanwhile
        return out
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        for child in children:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if janitor.TAG.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                    continue
            out |= {int(child), *descendants(int(child))}
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent has not reaped it


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_children_die_with_up_when_it_is_killed_outright(tmp_path):
    err = tmp_path / "up.stderr"  # a file, not a pipe: nobody reads it while the fleet runs
    tmp = tmp_path / "tmp"  # where `up` keeps the server's store and config, the keys, the edges' metrics
    tmp.mkdir()
    with err.open("wb") as f:
        up = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tokenyard.cli", "up", "--workers", "1", "--profile", "zero", "--http-port", "0",
            "--nats-port", "0", "--edge-processes", "2", stdout=asyncio.subprocess.PIPE, stderr=f,
            env={**os.environ, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": str(tmp_path / "xdg")},
        )
    try:
        async with asyncio.timeout(120):
            while not (line := await up.stdout.readline()).startswith(b"  HTTP"):  # after the creds' copies
                if not line:
                    await up.wait()
                    pytest.fail(f"up exited ({up.returncode}) before the fleet was up:\n{err.read_text()[-3000:]}")
        children = descendants(up.pid)
        assert len(children) >= 6  # nats-server, 2 edges, queue (with the router and admission), macro, a worker
        kept = {p.name.rsplit("-", 1)[0] for p in tmp.iterdir()}
        assert kept == {"tokenyard-nats", "tokenyard-creds", "tokenyard-edge-metrics"}, kept
        copies = sorted(p.name for p in (tmp_path / "xdg").rglob("*.creds"))  # for this machine's commands
        assert copies == ["client.creds", "observer.creds"], copies
        up.kill()  # SIGKILL: no handler runs, nothing is stopped by the parent
        await up.wait()
        # each child gets SIGTERM from the kernel and drains
        await until(lambda: not any(alive(p) for p in children), timeout_s=60, poll_s=0.1)
        await until(lambda: not any(tmp.iterdir()), timeout_s=30, poll_s=0.1,
                    what="the sweeper removes the store, the keys and the metrics files")
        assert not list((tmp_path / "xdg").rglob("*.creds"))
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_up_killed_outright_mid_stream_cuts_its_http_clients_and_its_children_within_seconds(tmp_path):
    """SIGKILL takes nats-server down with `up`'s other children: a drain can reach nobody. The
    edge (in the queue's process, up's default) waited for its streams until aiohttp's 60 s
    shutdown timeout, its HTTP clients left hanging, and a worker let its generation run to its
    end; each stops once its connection has been down service.BUS_GONE_S."""
    from tokenyard.shared.service import BUS_GONE_S

    with (tmp_path / "up.stderr").open("wb") as err:
        up = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tokenyard.cli", "up", "--workers", "1", "--http-port", "0", "--nats-port", "0",
            stdout=asyncio.subprocess.PIPE, stderr=err, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        async with asyncio.timeout(120):
            while not (line := await up.stdout.readline()).startswith(b"  HTTP"):
                assert line, f"up exited before the fleet was up:\n{(tmp_path / 'up.stderr').read_text()[-3000:]}"
        url = line.split()[1].decode()
        children = descendants(up.pid)
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as http:  # a stream of a minute on an A100's step times
            async with http.post(f"{url}/completions", json={"prompt": "a long one", "max_tokens": 6000,
                                                             "stream": True}) as resp:
                assert resp.status == 200 and (await resp.content.readline()).startswith(b"data: ")
                up.kill()
                killed = loop.time()
                with contextlib.suppress(aiohttp.ClientPayloadError):  # cut mid-stream: the process went
                    async with asyncio.timeout(BUS_GONE_S + 6):
                        while await resp.content.readline():
                            pass
                assert loop.time() - killed < BUS_GONE_S + 6
        await until(lambda: not any(alive(p) for p in children), timeout_s=BUS_GONE_S + 12, poll_s=0.1,
                    what="every child of the killed up gone")
    finally:
        if up.returncode is None:
            up.kill()
        await up.wait()


def test_up_refuses_a_fleet_without_workers(capsys):
    assert cli.main(["up", "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


async def test_worker_http_gives_each_worker_its_own_front_that_serves_the_engine_alone():
    """bench.control_plane's HTTP engine-alone path: each worker's own OpenAI front on a port
    of its own (`tokenyard worker --http PORT`), answering a completion without the control plane."""
    async with FleetProcesses(workers=2, profile="zero", http_port=0, edge_processes=1, metrics=False,
                              worker_http=True) as fleet:
        cmds = dict(fleet.commands())
        ports = [int(cmds[f"worker-{i}"][cmds[f"worker-{i}"].index("--http") + 1]) for i in range(2)]
        assert len(set(ports)) == 2 and fleet.worker_http_urls == [f"http://127.0.0.1:{p}" for p in ports]
        async with aiohttp.ClientSession() as http:
            for url in fleet.worker_http_urls:
                async def answered(url=url) -> bool:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{url}/health") as resp:
                            return resp.status == 200
                    return False
                await until(answered, timeout_s=30.0, what=f"{url}/health")
                body = {"model": fleet.model, "prompt": "Hello", "max_tokens": 2}
                async with http.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["usage"]["completion_tokens"] == 2
    assert FleetProcesses(workers=2).worker_http_urls == []  # off by default: no port taken


def test_up_takes_nats_port_4222_unless_it_is_taken():
    assert nats_port(5000) == 5000
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", NATS_PORT))
        except OSError:
            pass  # already taken by someone else: the same situation
        assert nats_port(None) == 0  # a free port, chosen when the server starts


async def test_a_service_dying_while_the_fleet_is_up_is_named_once_and_the_rest_serve():
    fleet = FleetProcesses(workers=2, profile="zero", http_port=0)
    await fleet.start()
    try:
        dict(fleet.procs)["worker-0"].kill()
        async with asyncio.timeout(30):
            why = await fleet.next_exit(poll_s=0.05)
        assert why.startswith("worker-0 exited with code -9; its last lines:")
        nc = await natsutil.connect(fleet.nats_url, "test")
        done = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="still there", max_tokens=2))
        assert done.finish_reason == "length" and done.worker_id == "w1"
        await nc.drain()
        with pytest.raises(TimeoutError):  # reported once: nothing new to say
            async with asyncio.timeout(0.3):
                await fleet.next_exit(poll_s=0.05)
    finally:
        await fleet.stop()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_edge_processes_killed_under_up_are_named_and_started_again_and_the_port_answers():
    """`tokenyard up --edge-processes 2`: the edge's supervisor runs in `up`'s process. Both
    edge processes SIGKILLed: each death is reported once, with its last lines; each is
    started again (before: never, and the port stayed dead); the port answers again, and the
    metrics on it count on."""
    # 7 processes starting at nice 19 on a loaded host may take more than the default minute
    fleet = FleetProcesses(workers=1, profile="zero", http_port=0, edge_processes=2, ready_timeout_s=180)
    await fleet.start()
    try:
        first = dict(fleet.procs)
        for name in ("edge-0", "edge-1"):
            first[name].kill()
        async with asyncio.timeout(30):
            reports = sorted([await fleet.next_exit(poll_s=0.05), await fleet.next_exit(poll_s=0.05)])
        assert [r.split(";")[0] for r in reports] == ["edge-0 exited with code -9", "edge-1 exited with code -9"]
        await until(lambda: {n: p.pid for n, p in fleet.procs if n.startswith("edge-") and p.poll() is None}.keys()
                    == {"edge-0", "edge-1"}, timeout_s=60, what="both edges started again")
        assert {dict(fleet.procs)[n].pid for n in ("edge-0", "edge-1")}.isdisjoint({first[n].pid for n in first})
        nc = await natsutil.connect(fleet.nats_url, "test")
        await until(lambda: _edges_registered(nc, 2), timeout_s=60, what="both edges on NATS again")
        await nc.drain()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            for i in range(4):  # new connections: each lands on a restarted process
                body = {"model": "tokenyard-sim", "prompt": f"after {i}", "max_tokens": 2}
                async with http.post(f"{fleet.http_url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
            async with http.get(f"{fleet.http_url}/metrics") as resp:
                text = await resp.text()
        assert 'tokenyard:edge_requests_total{endpoint="completions",outcome="finished"} 4.0' in text
        assert "tokenyard:edge_in_flight_requests 0.0" in text
        assert fleet.edge_supervisor is not None and fleet.edge_supervisor.restarts == 2
        # a reported, replaced process keeps nothing open (a crash-looping edge leaked a pipe a restart)
        assert all(first[n].stderr.closed for n in ("edge-0", "edge-1"))
        with pytest.raises(TimeoutError):  # each death reported once: nothing new to say
            async with asyncio.timeout(0.3):
                await fleet.next_exit(poll_s=0.05)
    finally:
        await fleet.stop()
    assert fleet.procs == []


async def _edges_registered(nc, n: int) -> bool:
    return (await ping(nc))["tokenyard-edge"] == n


@pytest.mark.parametrize(("argv", "message"), [
    (["--speed", "0"], "--speed must be > 0"),
    (["--macro-size", "0"], "--macro-size must be at least 1"),
    (["--edge-processes", "-1"], "--edge-processes must be at least 0"),
    (["--engine", "vllm"], "--engine vllm needs --model PATH"),
])
def test_up_refuses_bad_settings_before_starting_anything(capsys, argv, message):
    assert cli.main(["up", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"tokenyard up: error: {message}")


def test_up_refuses_a_taken_http_port_even_one_another_fleets_edges_share(capsys):
    """Edge processes bind with SO_REUSEPORT: without this check a second fleet's edges would
    bind beside the first's and the kernel would split the port's connections between them."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["up", "--http-port", str(port)]) == 2
    assert capsys.readouterr().err.startswith(f"tokenyard up: error: --http-port {port} is in use")
