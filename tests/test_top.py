"""`tokenyard top`: rates and rendering from hand-made rounds, then one snapshot of a live
fleet (in process, and as the `tokenyard top --once` command)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from rich.console import Console
from tokenyard.shared import nats_auth, natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from tests import builders
from tokenyard import top


def admission(decisions: dict, refusals: dict, requests: int) -> dict:
    return {"name": "tokenyard-admission", "id": "A", "version": "0.1.0", "metadata": {"instance": "admission-1"},
            "endpoints": [{"name": "submit", "num_requests": requests, "num_errors": 0,
                           "average_processing_time": 250_000, "data": {"decisions": decisions,
                                                                        "refusals": refusals}}]}


def worker(finished: float) -> dict:
    return {"name": "tokenyard-worker", "id": "W", "version": "0.1.0", "metadata": {"instance": "w0"},
            "endpoints": [{"name": "generate", "num_requests": 0, "data": {"finished": {"w0,length": finished}}}]}


def test_a_service_with_several_endpoints_is_counted_once():
    """nats.micro repeats a service's stats on each endpoint: a worker's generate, status and
    state each carry the same `finished` (top counted every request three times)."""
    three = worker(6)
    three["endpoints"] = [{**three["endpoints"][0], "name": name} for name in ("generate", "status", "state")]
    three["endpoints"].insert(0, {"name": "generate", "num_requests": 0, "data": None})
    assert top.Sample(1.0, [three]).counters()["finished"] == 6


def hb(wid: str, **kw) -> schemas.Heartbeat:
    base = dict(ts=99.5, running=3, waiting=1, queued=512, used=30, free=70, prefix_hits=1, prefix_queries=4,
                phase=schemas.Phase.PREFILL, macro_id="m0")
    return builders.hb(wid, **{**base, **kw})


def cells(text: str) -> dict[str, list[str]]:
    """Table rows by their first cell."""
    out = {}
    for line in text.splitlines():
        if "│" in line:  # a body row (the tables have inner rules only)
            row = [c.strip() for c in line.split("│")]
            out[row[0]] = row
    return out


def test_rates_are_counter_differences_over_time():
    prev = top.Sample(90.0, [admission({"admitted": 10}, {}, 10), worker(8)])
    cur = top.Sample(92.0, [admission({"admitted": 26, "rejected_rate": 4}, {"rate_limit_exceeded": 4}, 30),
                            worker(20)])
    r = top.rates(prev, cur)
    assert r["requests"] == 10.0  # (30 - 10) / 2 s
    assert r["refused:rate_limit_exceeded"] == 2.0
    assert r["finished"] == 6.0
    assert top.rates(None, cur) == {}
    assert top.rates(cur, cur) == {}  # no time passed: no rate


def test_render_shows_services_workers_and_queue():
    queue = schemas.QueueStats("queue-1", 100.0, "hybrid", [0, 2, 5, 0], [0, 100, 900, 0], in_flight=3,
                               drain_requests_per_s=7.5)
    prev = top.Sample(99.0, [admission({"admitted": 1}, {}, 1)])
    cur = top.Sample(100.0, [admission({"admitted": 3, "rejected_capacity": 1}, {"overloaded": 1}, 4)],
                     {"w0": hb("w0"), "w1": hb("w1", draining=True, used=0, running=0)}, queue)
    console = Console(record=True, width=200)
    console.print(top.render(cur, prev))
    text = console.export_text()
    assert "requests 3.0/s" in text and "refused 1.0/s" in text and "overloaded 1.0/s" in text
    rows = cells(text)
    assert rows["w0"] == ["w0", "sim", "m0", "prefill", "3", "1", "512", "30.0%", "25%", "0", "0.5"]
    assert rows["w1 (draining)"][4] == "0" and rows["w1 (draining)"][7] == "0.0%"
    assert rows["admission"] == ["admission", "admission-1", "0.1.0", "submit", "4", "0", "0.25"]
    assert rows["hybrid"] == ["hybrid", "0", "2", "5", "0", "3", "7.5"]


def test_a_queue_holding_no_backlog_shows_no_drain_rather_than_zero():
    """What leaves a queue with nothing waiting is the demand, not a drain: nothing measured."""
    def drain_cell(queue: schemas.QueueStats) -> str:
        console = Console(record=True, width=200)
        console.print(top.render(top.Sample(100.0, [admission({"admitted": 1}, {}, 1)], {"w0": hb("w0")}, queue), None))
        return cells(console.export_text())["hybrid"][-1]

    assert drain_cell(schemas.QueueStats("queue-1", 100.0, "hybrid", [0] * 4, [0] * 4, in_flight=2,
                                         drain_measured=False)) == "-"
    # a backlog that drains nothing is measured: a stall shows as one
    assert drain_cell(schemas.QueueStats("queue-1", 100.0, "hybrid", [0, 3, 0, 0], [0, 90, 0, 0])) == "0.0"


def test_a_plain_fleet_fits_80_columns_uncut():
    """No macro-instance and every worker mixed: those two columns are left out, and nothing in
    the three tables is cut short at a plain terminal's 80 columns."""
    plain = {f"worker-{i}": hb(f"worker-{i}", macro_id=None, phase=schemas.Phase.MIXED, running=12, queued=40960)
             for i in range(4)}
    queue = schemas.QueueStats("queue-1", 100.0, "hybrid", [0, 2, 5, 0], [0, 100, 900, 0], in_flight=3,
                               drain_requests_per_s=7.5)
    cur = top.Sample(100.0, [admission({"admitted": 3}, {}, 12345)], plain, queue)
    console = Console(record=True, width=80)
    console.print(top.render(cur, None))
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    rows = cells(text)
    assert rows["worker-3"] == ["worker-3", "sim", "12", "1", "40960", "30.0%", "25%", "0", "0.5"]
    assert rows["admission"] == ["admission", "admission-1", "0.1.0", "submit", "12345", "0", "0.25"]


async def test_once_against_a_live_fleet(fleet):
    client = TokenyardClient(fleet.nats)
    for i in range(3):
        await client.generate(schemas.GenerateRequest(prompt=f"top {i}", max_tokens=2))
    console = Console(record=True, width=220)
    assert await top.run(fleet.nats_url, once=True, interval_s=0.3, console=console) == 0
    text = console.export_text()
    for kind in ("admission", "queue", "router", "macro", "worker"):
        assert kind in text
    rows = cells(text)
    assert rows["admission"][3:5] == ["submit", "3"]  # admission's endpoint answered 3 requests
    assert rows["tw0"][1] == "sim" and rows["tw1"][1] == "sim"
    assert rows["tw0"][4] == rows["tw1"][4] == "0"  # nothing running any more
    assert rows["fcfs"][1:5] == ["0", "0", "0", "0"]  # the queue's state arrived: empty


async def test_top_command_prints_one_snapshot(fleet, tmp_path):
    """As the read-only `observer` (the creds `tokenyard up` leaves for this machine's commands;
    `top` connected as the operator and died with a traceback on a secured fleet)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokenyard.cli", "top", "--nats", fleet.nats_url, "--once", "--interval", "0.3",
        "--svg", str(tmp_path / "top.svg"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "200", "PATH": "", **nats_auth.child_env(fleet.nats_url, nats_auth.OBSERVER)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "tokenyard top" in text and "tw0" in text and "tw1" in text and "workers (heartbeats;" in text
    svg = (tmp_path / "top.svg").read_text()
    assert svg.startswith("<svg") and "tw0" in svg


async def test_the_observer_reads_every_services_stats(fleet):
    """What it may not do is in tests/test_security_nats.py (SERVICE_REFUSED)."""
    nc = await natsutil.connect(fleet.nats_url, "observer-test", kind=nats_auth.OBSERVER)
    try:
        services = await natsutil.gather_replies(nc, "$SRV.STATS", 1.0)
        assert {s["name"] for s in services} >= {"tokenyard-admission", "tokenyard-queue", "tokenyard-worker"}
    finally:
        await nc.close()


def test_no_nats_is_one_line_not_a_traceback():
    out = subprocess.run([sys.executable, "-m", "tokenyard.cli", "top", "--nats", "nats://127.0.0.1:1", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("tokenyard top: error: cannot reach NATS at nats://127.0.0.1:1"), out.stderr
