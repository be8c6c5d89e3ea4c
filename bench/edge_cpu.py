"""The edge's CPU per streamed token, two codes side by side in one run: REF's edge and this
tree's, each a real `tokenyard edge` process (uvloop, its own allocator setting, as deployed),
behind one nats-server and one stand-in engine, fed the same streams in alternating order.

    python -m bench.edge_cpu --baseline main [--streams 100] [--tokens 60] [--step-ms 50] [--rounds 3]
                             [--processes 1] [--ref-processes N] [--json FILE]

The stand-in (in this process) plays admission and the workers: it accepts each request and
then steps like an engine, every `--step-ms` publishing one chunk for every running stream (a
burst, as a real engine step ends with one chunk per running sequence), then `finished`.
Per run, `--streams` SSE clients (aiohttp, this process) stream `--tokens` tokens each
through one edge; the edge's CPU is its process's utime + stime (/proc/PID/stat) over the
run, divided by the tokens the clients received. Each chunk's text is the stand-in's clock
at its publish, so the clients also measure each token's transit (stand-in publish → SSE
frame read), a wall-clock figure that includes waiting for a CPU on a busy machine.
Rounds alternate the order (REF first, then this tree first, …) so neither code always runs
on a warmer or quieter machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from tokenyard.shared import codec, natsutil, schemas, subjects

from bench._out import log_dir, write_result
from bench.baseline import baseline_env, commit_of
from bench.live_router import _wait_http

STEP_MS = 50.0
"""The stand-in engine's default step: one chunk per running stream every 50 ms. With 100
streams that is 2,000 tokens/s through the edge, the rate of the live runs at ×3
(bench/live_router.py: ~40,000 tokens in ~30 s), and leaves this process (stand-in and
clients) CPU to spare, so the transit it measures is the edge's, not this process's backlog."""
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat fields 14 and 15), its
    live children's included: an edge of several processes (`--processes`) is a supervisor
    and its edge processes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) * TICK_S
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    return own + sum(cpu_s(c) for c in children)


class StandIn:
    """Admission and the engines in one: accept, then one chunk per running stream per step."""

    def __init__(self, nc, tokens: int, step_s: float):
        self.nc = nc
        self.tokens = tokens
        self.step_s = step_s
        self.running: dict[str, tuple[str, int]] = {}  # request id → (inbox, next seq)

    async def on_health(self, msg) -> None:  # admission's answer to an edge's readiness probe (/health)
        await msg.respond(codec.encode(schemas.FleetHealth(workers_up=1, workers_known=1)))

    async def on_submit(self, msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest)
        await self.nc.publish(msg.reply, codec.encode(schemas.Accepted(req.request_id, 1, 10)))
        self.running[req.request_id] = (msg.reply, 0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            step_end = loop.time() + self.step_s
            for rid, (inbox, seq) in list(self.running.items()):
                if seq < self.tokens:
                    text = f" {time.monotonic():.6f}"
                    await self.nc.publish(inbox, codec.encode(schemas.Chunk(rid, seq, text, [seq])))
                    self.running[rid] = (inbox, seq + 1)
                else:
                    usage = schemas.Usage(10, self.tokens, 10 + self.tokens)
                    await self.nc.publish(inbox, codec.encode(schemas.Finished(rid, seq, "length", usage)))
                    del self.running[rid]
            await asyncio.sleep(max(0.0, step_end - loop.time()))


async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int, transit: list[float]) -> int:
    body = {"model": "tokenyard-sim", "prompt": "hi", "max_tokens": tokens, "stream": True}
    got = 0
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.monotonic()
            text = json.loads(line[6:])["choices"][0]["text"]
            if text:
                transit.append(now - float(text))
                got += 1
    return got


def start_edge(nats_url: str, port: int, env: dict[str, str], log: Path, processes: list[str]) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115  (closed with the process's end: the child holds it)
    return subprocess.Popen(
        [sys.executable, "-m", "tokenyard.cli", "edge", "--nats", nats_url, "--http-port", str(port),
         "--model", "tokenyard-sim", *processes],
        env={**os.environ, **env}, stdout=out, stderr=out)


async def measure(session, edge: subprocess.Popen, url: str, streams: int, tokens: int) -> dict[str, Any]:
    transit: list[float] = []
    before, t0 = cpu_s(edge.pid), time.monotonic()
    got = sum(await asyncio.gather(*(one_stream(session, url, tokens, transit) for _ in range(streams))))
    cpu, wall = cpu_s(edge.pid) - before, time.monotonic() - t0
    transit.sort()
    return {"tokens": got, "edge_cpu_s": round(cpu, 3), "us_per_token": round(cpu / got * 1e6, 1),
            "wall_s": round(wall, 2), "load_avg": round(os.getloadavg()[0], 1),
            "transit_p50_ms": round(transit[len(transit) // 2] * 1e3, 2),
            "transit_p99_ms": round(transit[int(len(transit) * 0.99)] * 1e3, 2)}


async def main_async(args) -> dict[str, Any]:
    ref = commit_of(args.baseline)
    server = await natsutil.NatsServer().start()
    nc = await natsutil.connect(server.url, "bench-edge-cpu")
    stand_in = StandIn(nc, args.tokens, args.step_ms / 1e3)
    await nc.subscribe(subjects.SUBMIT, cb=stand_in.on_submit)
    await nc.subscribe(subjects.ADMISSION_HEALTH, cb=stand_in.on_health)
    stepper = asyncio.create_task(stand_in.run())
    logs = log_dir(args.log_dir, "edge-cpu")
    edges: dict[str, tuple[subprocess.Popen, str]] = {}
    runs: list[dict[str, Any]] = []
    try:
        with baseline_env(ref) as env:
            ref_env = {**env, **dict(kv.split("=", 1) for kv in args.ref_env)}
            processes = {"ref": ["--processes", str(args.ref_processes)] if args.ref_processes else [],
                         "this": ["--processes", str(args.processes)]}
            for code, code_env in (("ref", ref_env), ("this", {})):
                port = natsutil.free_port()
                proc = start_edge(server.url, port, code_env, logs / f"edge-{code}.log", processes[code])
                edges[code] = (proc, f"http://127.0.0.1:{port}")
            for proc, url in edges.values():
                await asyncio.to_thread(_wait_http, f"{url}/health", [proc])
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                for proc, url in edges.values():  # warm-up: imports, first connections
                    await measure(session, proc, f"{url}/v1/completions", min(args.streams, 10), args.tokens)
                for rnd in range(1, args.rounds + 1):
                    order = ("ref", "this") if rnd % 2 else ("this", "ref")
                    for code in order:
                        proc, url = edges[code]
                        row = {"round": rnd, "code": code, "load_avg_start": round(os.getloadavg()[0], 1),
                               **await measure(session, proc, f"{url}/v1/completions", args.streams, args.tokens)}
                        runs.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        stepper.cancel()
        for proc, _ in edges.values():
            proc.terminate()
        for proc, _ in edges.values():
            proc.wait(timeout=30)
        await nc.close()
        server.stop()
    summary = {code: {"us_per_token_median": statistics.median(r["us_per_token"] for r in runs if r["code"] == code),
                      "transit_p50_ms_median": statistics.median(r["transit_p50_ms"] for r in runs if r["code"] == code),
                      "transit_p99_ms_median": statistics.median(r["transit_p99_ms"] for r in runs if r["code"] == code)}
               for code in ("ref", "this")}
    return {"baseline": ref, "ref_env": args.ref_env, "this": _head(), "streams": args.streams, "tokens": args.tokens, "step_ms": args.step_ms,
            "runs": runs, "summary": summary}


def _head() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


def table(doc: dict[str, Any]) -> str:
    out = ["| round | code | load average | tokens | edge CPU (s) | µs CPU per token | transit p50 (ms) | "
           "transit p99 (ms) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        name = f"{doc['baseline'][:7]} (ref)" if r["code"] == "ref" else f"{doc['this']} (this tree)"
        out.append(f"| {r['round']} | {name} | {r['load_avg_start']} → {r['load_avg']} | {r['tokens']} | "
                   f"{r['edge_cpu_s']:.2f} | {r['us_per_token']:.0f} | {r['transit_p50_ms']:.2f} | "
                   f"{r['transit_p99_ms']:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, metavar="REF", help="the commit whose edge to run beside this tree's")
    ap.add_argument("--streams", type=int, default=100, help="concurrent SSE streams per run (default 100)")
    ap.add_argument("--tokens", type=int, default=60, help="tokens per stream (default 60)")
    ap.add_argument("--step-ms", type=float, default=STEP_MS, help=f"the stand-in engine's step (default {STEP_MS:g})")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each code, alternating which goes first")
    ap.add_argument("--ref-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for REF's edge only (e.g. --baseline HEAD "
                         "--ref-env PYTHONMALLOC=pymalloc: the allocator's cost, same code)")
    ap.add_argument("--processes", type=int, default=1,
                    help="this tree's edge processes (default 1: CPU per token of one; more: of all together)")
    ap.add_argument("--ref-processes", type=int, default=None,
                    help="REF's edge processes (default: REF's own default; a REF before round 6 has no --processes)")
    ap.add_argument("--log-dir", default=None, help="the edges' logs (default: a new temporary folder, named on stderr)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON to this file (default: not written)")
    args = ap.parse_args()
    doc = asyncio.run(main_async(args))
    print(table(doc))
    write_result(args.json, doc, prog="python -m bench.edge_cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
