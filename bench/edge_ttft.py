"""What the HTTP edge alone adds to time to first token, two codes side by side in one run:
REF's edge and this tree's, each a real `tokenyard edge` process (uvloop, as deployed), behind
one nats-server and one stand-in control plane in a process of its own.

    python -m bench.edge_ttft --baseline main [--requests 300] [--gap-ms 20] [--processes 1] [--json FILE]

The stand-in (`--stand-in URL`, started by the bench) plays admission, queue, router and a
zero-time worker: for each request on `llm.v1.submit` it publishes the first chunk (carrying
the acceptance, as a worker's does) and `finished` on the request's inbox at once. It also
serves the same stream over HTTP itself (aiohttp SSE, one frame), the floor a front costs.
Each round sends one request (max_tokens = 1, stream) on each of four paths in a random
order, one at a time, `--gap-ms` apart (the control-plane bench's pacing):

    ref / this   HTTP through that edge → nats-server → stand-in → nats-server → edge → client
    nats         the same request straight over NATS (TokenyardClient in this process)
    http         the stand-in's own HTTP front (no NATS, no edge)

TTFT is the client's time from sending to the first token's SSE frame (its chunk over NATS).
`added` = a path's p50 less the `http` floor's p50, and the median of the paired per-round
differences beside it: what the edge's process costs on the first token's path (its two
HTTP crossings to the client are in the floor too; its NATS crossings and its own work are
not). Run under the live lock: it is a wall-clock measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
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
from tokenyard.shared.client import TokenyardClient

from bench._out import log_dir, write_result
from bench.baseline import baseline_env, commit_of
from bench.edge_cpu import _head, start_edge
from bench.live_router import _stop, _wait_http

PATHS = ("ref", "this", "nats", "http")


def _events(rid: str) -> tuple[schemas.Chunk, schemas.Finished]:
    chunk = schemas.Chunk(rid, 0, "x", [7], accepted=schemas.Accepted(rid, 1, 2))
    return chunk, schemas.Finished(rid, 1, "length", schemas.Usage(2, 1, 3))


async def stand_in(nats_url: str, port: int) -> None:
    """The stand-in control plane (a process of its own): answers every submit at once."""
    from aiohttp import web

    nc = await natsutil.connect(nats_url, "bench-edge-ttft-stand-in")

    async def on_submit(msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest)
        chunk, fin = _events(req.request_id)
        await nc.publish(msg.reply, codec.encode(chunk))
        await nc.publish(msg.reply, codec.encode(fin))

    async def on_http(request: web.Request) -> web.StreamResponse:
        await request.read()
        rid = "h" + str(time.monotonic_ns())
        body = (b'data: {"id":"' + rid.encode() + b'","object":"text_completion","choices":'
                b'[{"index":0,"text":"x","finish_reason":null}]}\n\n')
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(body)
        await response.write_eof(b"data: [DONE]\n\n")
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    await nc.subscribe(subjects.SUBMIT, cb=on_submit)
    app = web.Application()
    app.add_routes([web.post("/v1/completions", on_http), web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _http_ttft(session: aiohttp.ClientSession, url: str) -> float:
    body = {"model": "tokenyard-sim", "prompt": "hi", "max_tokens": 1, "stream": True}
    t0 = time.perf_counter()
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
        ttft = None
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError(f"{url}: no token")
    return ttft


async def _nats_ttft(client: TokenyardClient) -> float:
    t0 = time.perf_counter()
    ttft = None
    async for event in client.stream(schemas.GenerateRequest(prompt="hi", max_tokens=1)):
        if ttft is None and isinstance(event, schemas.Chunk):
            ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError("nats: no token")
    return ttft


def _p50_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 3)


def _p99_ms(xs: list[float]) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3, 3)


def summarize(ttft: dict[str, list[float]]) -> dict[str, Any]:
    """Per path: p50, p99, and what it adds over the `http` floor (p50 less p50; median of
    the per-round differences)."""
    floor = ttft["http"]
    out: dict[str, Any] = {}
    for path, xs in ttft.items():
        row = {"p50_ms": _p50_ms(xs), "p99_ms": _p99_ms(xs)}
        if path != "http":
            row["added_p50_ms"] = round(row["p50_ms"] - _p50_ms(floor), 3)
            row["added_paired_ms"] = _p50_ms([a - b for a, b in zip(xs, floor, strict=True)])
        out[path] = row
    return out


async def main_async(args) -> dict[str, Any]:
    ref = commit_of(args.baseline)
    server = await natsutil.NatsServer().start()
    logs = log_dir(args.log_dir, "edge-ttft")
    front_port = natsutil.free_port()
    procs: list[subprocess.Popen] = []
    ttft: dict[str, list[float]] = {p: [] for p in PATHS}
    load = [round(os.getloadavg()[0], 2)]
    nc = client = None
    try:
        out = open(logs / "stand-in.log", "ab")  # noqa: SIM115  (the child holds it)
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.edge_ttft", "--stand-in", server.url,
                                       "--front-port", str(front_port)], stdout=out, stderr=out,
                                      cwd=Path(__file__).resolve().parent.parent))
        urls = {"http": f"http://127.0.0.1:{front_port}/v1/completions"}
        with baseline_env(ref) as env:
            for code, code_env in (("ref", env), ("this", {})):
                port = natsutil.free_port()
                procs.append(start_edge(server.url, port, code_env, logs / f"edge-{code}.log",
                                        ["--processes", str(args.processes)]))
                urls[code] = f"http://127.0.0.1:{port}/v1/completions"
            for url in urls.values():
                await asyncio.to_thread(_wait_http, url.replace("/v1/completions", "/health"), procs)
            nc = await natsutil.connect(server.url, "bench-edge-ttft")
            client = TokenyardClient(nc)
            rng = random.Random(args.seed)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                for i in range(args.warmup + args.requests):
                    order = list(PATHS)
                    rng.shuffle(order)
                    row = {}
                    for path in order:
                        row[path] = await (_nats_ttft(client) if path == "nats" else _http_ttft(session, urls[path]))
                        await asyncio.sleep(args.gap_ms / 1e3)
                    if i >= args.warmup:
                        for path, v in row.items():
                            ttft[path].append(v)
        load.append(round(os.getloadavg()[0], 2))
    finally:
        if client is not None:
            await client.close()
        if nc is not None:
            await nc.close()
        _stop(procs)
        server.stop()
    return {"baseline": ref, "this": _head(), "requests": args.requests, "gap_ms": args.gap_ms,
            "processes": args.processes, "load_avg": load, "summary": summarize(ttft)}


def table(doc: dict[str, Any]) -> str:
    names = {"ref": f"edge, {doc['baseline'][:7]} (ref)", "this": f"edge, {doc['this']} (this tree)",
             "nats": "NATS straight to the stand-in", "http": "the stand-in's own HTTP front (floor)"}
    out = ["| path | TTFT p50 (ms) | TTFT p99 (ms) | added p50 (ms) | added, paired (ms) |",
           "|---|---:|---:|---:|---:|"]
    for path in PATHS:
        r = doc["summary"][path]
        out.append(f"| {names[path]} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                   f"{r.get('added_p50_ms', 0):.3f} | {r.get('added_paired_ms', 0):.3f} |")
    out.append(f"\nload average {doc['load_avg'][0]} → {doc['load_avg'][1]}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main", metavar="REF", help="the commit whose edge to run beside this tree's")
    ap.add_argument("--requests", type=int, default=300, help="rounds measured (one request per path each)")
    ap.add_argument("--warmup", type=int, default=20, help="rounds first, not counted")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="pause after each request")
    ap.add_argument("--processes", type=int, default=1, help="processes of each edge (default 1)")
    ap.add_argument("--seed", type=int, default=1, help="seed of each round's random order of the paths (default 1)")
    ap.add_argument("--log-dir", default=None, help="the edges' and the stand-in's logs (default: a new temporary folder, named on stderr)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON to this file (default: not written)")
    ap.add_argument("--stand-in", default=None, metavar="NATS_URL", help=argparse.SUPPRESS)
    ap.add_argument("--front-port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stand_in:
        import uvloop

        uvloop.install()
        asyncio.run(stand_in(args.stand_in, args.front_port))
        return 0
    doc = asyncio.run(main_async(args))
    print(table(doc))
    write_result(args.json, doc, prog="python -m bench.edge_ttft")
    return 0


if __name__ == "__main__":
    sys.exit(main())
