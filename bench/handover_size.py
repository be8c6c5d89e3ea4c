"""How a worker with many long streams hands them over when their placing router dies
(shared/adoption.py): one sim worker and routers A and B in this process, on a secured
nats-server with the default max payload (1 MiB); A places N streams whose history is R tokens
each (resumed token ids, as a migrated request carries: ~4 bytes each in MessagePack, in the ask
and in the state); A's connection closes; the time until B follows all N, the asks it took and
their largest size.

    python -m bench.handover_size [--streams 300] [--resumed 3000] [--json FILE]

The engine barely runs (--speed 0.002): the streams stay, running or waiting, for the whole
probe. The clock starts at A's close, so it includes the worker's two probes of A (3 s apart,
after A went unproven for 3 s) before the first ask.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.services.router.core import RouterConfig
from tokenyard.services.router.shell import RouterShell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import SimEngine
from tokenyard.services.worker.sim.latency import profile
from tokenyard.shared import codec, config, nats_auth, natsutil, schemas, subjects
from tokenyard.shared.adoption import AdoptAsk
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from bench._out import write_result


async def until(cond, timeout_s: float, poll_s: float = 0.02) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError
        await asyncio.sleep(poll_s)
    return time.monotonic()


async def main_async(args) -> dict[str, Any]:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="handover-creds-") as creds:
        server = await natsutil.NatsServer(auth=nats_auth.FleetAuth.generate(creds)).start()
        hosts = []
        try:
            engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=args.speed)
            worker = await ServiceHost(WorkerShell(WorkerConfig("hw0", config.DEFAULT_MODEL, max_waiting=1_000_000,
                                                                flow_control=False), engine, ByteTokenizer()),
                                       server.url).start()
            router_a = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start()
            hosts = [worker, router_a]
            nc = await natsutil.connect(server.url, "handover-bench")
            asks: list[tuple[float, int]] = []

            async def on_ask(msg) -> None:
                asks.append((time.monotonic(), len(msg.data)))

            await nc.subscribe(subjects.ADOPT, cb=on_ask)
            await until(lambda: "hw0" in router_a.shell.core.view.ids, 10)
            reqs = [schemas.AdmittedRequest(
                request_id=f"ho-{i}", reply_to=f"_INBOX.handover.{i}", model=config.DEFAULT_MODEL,
                prompt_token_ids=[rng.randrange(1000, 128_000) for _ in range(64)], prompt_len=64, block_hashes=[],
                block_size=16, max_tokens=args.resumed + 1000, priority=1, arrival_s=time.time(),
                resume_token_ids=[rng.randrange(1000, 128_000) for _ in range(args.resumed)], resume_seq=args.resumed,
                migrations=1) for i in range(args.streams)]
            whole = len(codec.encode(AdoptAsk("hw0", reqs)))
            t_start = time.monotonic()
            for ar in reqs:  # all placed by A (B, in the same queue group, starts after)
                d = codec.decode((await nc.request(subjects.ROUTE, codec.encode(ar), timeout=10)).data,
                                 schemas.RouteDecision)
                assert d.outcome == schemas.Outcome.ROUTED, d
            router_b = await ServiceHost(RouterShell(RouterConfig(policy="least-loaded")), server.url).start()
            hosts.append(router_b)
            t_placed = time.monotonic()
            await until(lambda: "hw0" in router_b.shell.core.view.ids, 10)
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            await router_a.nc.close()
            b = router_b.shell.migration
            t1 = await until(lambda: all(ar.request_id in b.tracked for ar in reqs), args.timeout)
            row = {"streams": args.streams, "resumed_tokens": args.resumed, "max_payload": worker.nc.max_payload,
                   "one_ask_bytes": whole, "asks": len(asks), "largest_ask_bytes": max(n for _, n in asks),
                   "first_ask_s": round(asks[0][0] - t0, 2), "all_adopted_s": round(t1 - t0, 2),
                   "asks_to_adopted_s": round(t1 - asks[0][0], 2),
                   "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]}
            print(row, f"(placing took {t_placed - t_start:.1f} s)", flush=True)
            for ar in reqs:
                await worker.shell.engine.abort(ar.request_id)
            await nc.close()
            return {"config": vars(args), "run": row}
        finally:
            for h in reversed(hosts):
                if not h.nc.is_closed:
                    await h.nc.close()
            server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.handover_size", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=300, help="streams router A places on the worker (default: %(default)s)")
    p.add_argument("--resumed", type=int, default=3000, help="each stream's history in tokens")
    p.add_argument("--speed", type=float, default=0.002, help="the sim engine's speed (simulated s per wall s)")
    p.add_argument("--timeout", type=float, default=90.0, help="the most the hand-over may take (s)")
    p.add_argument("--json", default="", help="write the result as JSON to this file (default: not written)")
    args = p.parse_args(argv)
    write_result(args.json, asyncio.run(main_async(args)), "python -m bench.handover_size", argv)


if __name__ == "__main__":
    main()
