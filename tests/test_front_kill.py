"""`tokenyard up`'s default layout under a front's death (bench/faults/fronts.py): two queue
processes, each with the HTTP edge, admission and the router in it, serve one HTTP port
(SO_REUSEPORT, services/priority_queue/cli.py); SIGKILL one mid-stream. Its HTTP clients see
their connection close at once, never a hang; the other front's HTTP clients and every NATS
client complete, nothing twice; the survivor serves new requests over both. And the probes'
own reading of an edge supervisor's children leaves out the janitor's sweeper (it once killed
the sweeper instead of an edge, and nothing died)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from tokenyard.shared import janitor

from bench.faults.fronts import probe_front_kill
from bench.faults.replicas import children_of
from tests.conftest import until


async def test_a_killed_front_cuts_its_own_http_clients_and_loses_no_nats_request(tmp_path):
    args = argparse.Namespace(profile="a100-llama3-8b", log_dir=str(tmp_path), tokens=300, edge_streams=12,
                              deadline_s=90.0, layout="in-queue")
    row = await probe_front_kill(args)
    web = row["http_killed_front"] + row["http_other_front"]  # 12, more while one front had them all
    assert row["sent"] == web + 12 and 12 <= web <= 24 and row["hung"] == 0, row
    # both fronts served the one port (SO_REUSEPORT), each connection held by one of them
    assert row["http_killed_front"] > 0 and row["http_other_front"] > 0 and row["http_on_neither"] == 0, row
    assert row["http_killed_cut"] == row["http_killed_front"], row  # every one of the killed front's cut
    assert row["http_other_completed"] == row["http_other_front"], row
    assert row["max_s_to_error"] < 5.0, row  # the connection closes with the process: no timeout ends it
    assert all("ClientPayloadError(\"Response payload is no" in m for m in row["errors_sample"]), row
    assert (row["nats_completed"], row["nats_not_completed"], row["nats_finished_twice"]) == (12, 0, 0), row
    assert (row["duplicated"], row["gaps"], row["events_after_end"]) == (0, 0, 0), row
    assert row["after"] == {"http": {"completed": 8}, "nats": {"completed": 8}}, row


async def test_a_supervisors_children_are_its_edges_not_the_janitors_sweeper():
    code = ("import os, subprocess, sys, time\n"  # the tag from the environment: a child forked, not yet
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', os.environ['TAG']])\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"  # exec'd, shows this line
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TAG": janitor.TAG})

    def kids() -> list[int]:
        with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as f:
            return [int(p) for p in f.read().split()]

    def tagged(pid: int) -> bool:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return janitor.TAG.encode() in f.read()

    try:
        await until(lambda: len(kids()) == 2 and sum(map(tagged, kids())) == 1, timeout_s=20,
                    what="both children started, one of them the sweeper")
        edges = children_of(parent.pid)
        assert len(edges) == 1 and edges[0] in kids() and not tagged(edges[0])
    finally:
        for kid in kids():
            subprocess.run(["kill", "-9", str(kid)], check=False)
        parent.kill()
        parent.wait()
