"""The edge's per-token work, profiled: a real nats-server, the real EdgeShell (aiohttp), a
stand-in for admission that accepts each request and streams T chunk events on its inbox (4 at
a time, 10 ms apart), S concurrent SSE clients — all in this one process, under cProfile.

    python -m bench.edge_profile [STREAMS] [TOKENS]        # default 100 streams × 60 tokens

Prints the process's CPU per token (edge + stand-in + clients together) and the 35 functions
with the most own time. What it showed in round 4 (docs/results-latency.md): no single
hot spot — per token, nats-py's delivery, the client stream's per-message timeout and
ordering check, the OpenAI rendering and aiohttp's write with its send() each take a share.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time

import aiohttp
from nats.micro import add_service
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
from tokenyard.shared import codec, natsutil, schemas, subjects

S, T = 100, 60  # streams, tokens per stream (set from the command line in main)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.edge_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("streams", type=int, nargs="?", default=100, help="concurrent SSE streams (default 100)")
    p.add_argument("tokens", type=int, nargs="?", default=60, help="chunk events per stream (default 60)")
    args = p.parse_args(argv)
    if args.streams < 1 or args.tokens < 1:
        p.error("streams and tokens must be at least 1")
    return args


async def main():
    server = await natsutil.NatsServer().start()
    nc_fake = await natsutil.connect(server.url, "fake")
    async def on_submit(msg):
        req = codec.decode(msg.data, schemas.GenerateRequest)
        rid = req.request_id
        await nc_fake.publish(msg.reply, codec.encode(schemas.Accepted(rid, 1, 10)))
        for k in range(T):
            await nc_fake.publish(msg.reply, codec.encode(schemas.Chunk(rid, k, " tok", [k])))
            if k % 4 == 0:
                await asyncio.sleep(0.01)
        await nc_fake.publish(msg.reply, codec.encode(schemas.Finished(rid, T, "length", schemas.Usage(10, T, 10 + T))))
    async def spawn(m):
        asyncio.ensure_future(on_submit(m))
    await nc_fake.subscribe(subjects.SUBMIT, cb=spawn)
    nc = await natsutil.connect(server.url, "edge")
    svc = await add_service(nc, name="tokenyard-edge", version="0.0.1")
    edge = EdgeShell(EdgeConfig(http_port=0, models=[]))
    await edge.start(nc, svc)
    url = f"http://127.0.0.1:{edge.port}/v1/completions"
    async def one(session):
        body = {"model": "tokenyard-sim", "prompt": "hi", "max_tokens": T, "stream": True}
        async with session.post(url, json=body) as r:
            async for _ in r.content:
                pass
    prof = cProfile.Profile()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(5)))
        t0 = time.thread_time()
        prof.enable()
        await asyncio.gather(*(one(session) for _ in range(S)))
        prof.disable()
        cpu = time.thread_time() - t0
    print(f"{S} streams x {T} tokens: process CPU {cpu:.2f} s (edge + stand-in + clients), "
          f"{cpu / (S * T) * 1e6:.0f} us per token")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(35)
    print(out.getvalue())
    await edge.stop()
    await nc.close()
    await nc_fake.close()
    server.stop()
if __name__ == "__main__":
    _args = parse_args()
    S, T = _args.streams, _args.tokens
    asyncio.run(main())
