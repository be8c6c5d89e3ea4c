"""What the worker's lease and router probes cost (services/worker/leases.py): one sim worker
holding N long, nearly idle streams from C distinct NATS clients (each its own connection with a
lease inbox `_INBOX.<lease>.*`, as TokenyardClient holds), placed by one "router" connection; the
probes per second the worker sends, and the CPU of the worker's process and of nats-server per
wall second, with the probes on and switched off (`WorkerShell.probe_leases` a no-op: a bench
switch, no product knob), run after run on a fresh server each.

    python -m bench.probe_cost [--shapes 200x1,200x5,1000x1] [--window 20] [--json FILE]

A shape CxS is C clients with S streams each. The streams barely move (the sim engine at
--speed 0.002: a decode step takes seconds), so the chunks cost little beside the probes, and
what differs between on and off is the probes' cost: the sends, their 1 s timeouts, the per-tick
scan of the running requests (every 0.1 s), and nats-server's delivery. One probe per lease per
ORPHAN_AFTER_S, whatever its streams: CxS probes as many times a second as Cx1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats
from tokenyard.shared import codec, config, natsutil, schemas, subjects

from bench._out import write_result

WORKER = "pc0"
SETTLE_S = 8.0
"""After the last offer, before the window: every lease past its first probe (3 s) and the
placing router's too."""


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def worker_process(url: str, probes: bool, speed: float) -> None:
    """The worker under test, in a process of its own; prints `ready`, then its probe counts
    as JSON for each `stats` line on stdin."""
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.shared.service import ServiceHost
    from tokenyard.shared.tokenizer import ByteTokenizer

    engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=speed)
    shell = WorkerShell(WorkerConfig(WORKER, config.DEFAULT_MODEL, max_waiting=1_000_000, flow_control=False),
                        engine, ByteTokenizer())
    if not probes:
        shell.probe_leases = lambda: None
    await ServiceHost(shell, url).start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    while line := await reader.readline():
        if line.strip() == b"stats":
            print(json.dumps({"lease_probes": shell.core.leases.probes, "router_probes": shell.core.routers.probes,
                              "streams": len(shell.core.streams)}), flush=True)
    os._exit(0)  # its streams never end: no drain


async def one_run(clients: int, per_client: int, probes: bool, args) -> dict[str, Any]:
    server = await natsutil.NatsServer().start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.probe_cost", "--worker-proc", server.url, "--probes", "on" if probes else "off",
        "--speed", str(args.speed), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    conns = []
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"

        async def stats() -> dict:
            proc.stdin.write(b"stats\n")
            await proc.stdin.drain()
            return json.loads(await proc.stdout.readline())

        delivered = [0]

        async def on_msg(msg) -> None:
            if msg.subject.endswith(".alive"):
                delivered[0] += 1  # a probe; a live holder answers nothing (its subscription is the answer)

        placer = await nats.connect(server.url, name="probe-cost-router")
        conns.append(placer)
        for c in range(clients):
            nc = await nats.connect(server.url, name=f"probe-cost-client-{c}")
            conns.append(nc)
            await nc.subscribe(f"_INBOX.{c:016x}.*", cb=on_msg)
        for c in range(clients):
            for s in range(per_client):
                ar = schemas.AdmittedRequest(request_id=f"pc-{c}-{s}", reply_to=f"_INBOX.{c:016x}.{s}",
                                             model=config.DEFAULT_MODEL, prompt_token_ids=[], prompt_len=16,
                                             block_hashes=[], block_size=16, max_tokens=30_000, priority=1,
                                             arrival_s=time.time())
                reply = codec.decode((await placer.request(subjects.worker_generate(WORKER), codec.encode(ar),
                                                           timeout=10)).data, schemas.GenerateReply)
                assert reply.accepted, reply
        await asyncio.sleep(SETTLE_S)
        load0 = os.getloadavg()[0]
        s0, t0 = await stats(), time.monotonic()
        c0 = {"worker": cpu_s(proc.pid), "nats-server": cpu_s(server.proc.pid)}
        d0 = delivered[0]
        await asyncio.sleep(args.window)
        wall = time.monotonic() - t0
        c1 = {"worker": cpu_s(proc.pid), "nats-server": cpu_s(server.proc.pid)}
        s1 = await stats()
        row = {"clients": clients, "streams_per_client": per_client, "probes": "on" if probes else "off",
               "streams": s1["streams"], "wall_s": round(wall, 1),
               "lease_probes_per_s": round((s1["lease_probes"] - s0["lease_probes"]) / wall, 1),
               "router_probes_per_s": round((s1["router_probes"] - s0["router_probes"]) / wall, 2),
               "delivered_per_s": round((delivered[0] - d0) / wall, 1),
               "cpu_ms_per_s": {k: round((c1[k] - c0[k]) * 1e3 / wall, 1) for k in c0},
               "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        print(json.dumps(row), flush=True)
        return row
    finally:
        for nc in conns:
            await nc.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| clients × streams | probes | lease probes/s | router probes/s | worker CPU ms/s | nats-server CPU ms/s | load |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} × {r['streams_per_client']} | {r['probes']} | {r['lease_probes_per_s']} | "
                     f"{r['router_probes_per_s']} | {r['cpu_ms_per_s']['worker']} | {r['cpu_ms_per_s']['nats-server']} | "
                     f"{r['load_avg'][0]} → {r['load_avg'][1]} |")
    return "\n".join(lines)


async def main_async(args) -> dict[str, Any]:
    rows = []
    for shape in args.shapes.split(","):
        clients, per_client = (int(x) for x in shape.split("x"))
        for probes in (True, False):
            rows.append(await one_run(clients, per_client, probes, args))
    return {"config": {k: v for k, v in vars(args).items() if k not in ("worker_proc",)}, "runs": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probe_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="200x1,200x5,1000x1", help="clients x streams each, comma-separated")
    p.add_argument("--window", type=float, default=20.0, help="seconds measured per run")
    p.add_argument("--speed", type=float, default=0.002, help="the sim engine's speed (simulated s per wall s)")
    p.add_argument("--json", default="", help="write the runs here")
    p.add_argument("--worker-proc", default="", help=argparse.SUPPRESS)
    p.add_argument("--probes", default="on", choices=("on", "off"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_proc:
        asyncio.run(worker_process(args.worker_proc, args.probes == "on", args.speed))
        return
    doc = asyncio.run(main_async(args))
    print(table(doc["runs"]))
    write_result(args.json, doc, "python -m bench.probe_cost", argv)


if __name__ == "__main__":
    main()
