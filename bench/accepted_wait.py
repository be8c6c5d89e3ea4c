"""How long a stream's first token waits for admission's `accepted` at the client.

    python -m bench.accepted_wait [--requests 300] [--rate 20] [--json PATH]

Admission (in the queue's process) publishes `accepted` once the request's offer to a worker
has left; the worker publishes the first chunk. The two leave two processes on two
connections, so either may reach the client first. A client that shows nothing before
`accepted` (TokenyardClient did, until the first chunk carried the acceptance itself:
Chunk.accepted) holds a chunk that came first until `accepted` comes:

    held = max(0, t_accepted − t_first_chunk)        per request, as a raw subscriber sees them

This bench brings up the control-plane fleet (zero-latency workers, as bench.control_plane),
submits requests one at a time at `--rate` on a raw NATS subscription (no reordering), notes
when `accepted` and the first chunk arrive, and prints how often the chunk came first, the
hold a client waiting for `accepted` imposes, and whether the first chunk carries the
acceptance (then this tree's client holds nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.shared import codec, nats_auth, natsutil, schemas, subjects

from bench._out import write_result

PROMPT = "a short prompt of a few words"
TIMEOUT_S = 10.0


def summary(rows: list[tuple[float, float, bool]]) -> dict[str, Any]:
    """rows: (ms to `accepted`, ms to the first chunk, whether that chunk carried the acceptance)."""
    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    held = [max(0.0, a - c) for a, c, _ in rows]
    carried = sum(1 for *_, k in rows if k)
    return {
        "requests": len(rows),
        "accepted_p50_ms": statistics.median(a for a, _, _ in rows),
        "first_chunk_p50_ms": statistics.median(c for _, c, _ in rows),
        "first_chunk_before_accepted": sum(1 for a, c, _ in rows if c < a),
        "held_waiting_for_accepted_ms": {"p50": statistics.median(held), "p90": q(held, 0.9),
                                         "p99": q(held, 0.99), "mean": statistics.fmean(held)},
        "first_chunk_carries_acceptance": carried,
        "ttft_p50_ms": {"client_waits_for_accepted": statistics.median(max(a, c) for a, c, _ in rows),
                        "first_chunk_as_it_arrives": statistics.median(c for _, c, _ in rows)},
    }


async def measure(nats_url: str, model: str, requests: int, rate: float, warmup: int) -> list[tuple[float, float, bool]]:
    nc = await natsutil.connect(nats_url, "bench-accepted-wait", kind=nats_auth.CLIENT)
    arrivals: asyncio.Queue = asyncio.Queue()

    async def on_msg(msg) -> None:
        arrivals.put_nowait((time.perf_counter_ns(), msg))

    prefix = f"{nc.new_inbox().rsplit('.', 1)[0]}.{uuid.uuid4().hex[:12]}"
    await nc.subscribe(f"{prefix}.*", cb=on_msg)
    rows = []
    try:
        for i in range(warmup + requests):
            req = schemas.GenerateRequest(model=model, prompt=PROMPT, max_tokens=1, request_id=uuid.uuid4().hex)
            inbox = f"{prefix}.{i}"
            t0 = time.perf_counter_ns()
            await nc.publish(subjects.SUBMIT, codec.encode(req), reply=inbox)
            t_acc = t_chunk = None
            carried, ended = False, False
            async with asyncio.timeout(TIMEOUT_S):
                while not (ended and t_acc is not None):  # `accepted` may come after the stream's end
                    t, msg = await arrivals.get()
                    if msg.subject != inbox:
                        continue
                    event = codec.decode_event(msg.data, msg.headers)
                    if isinstance(event, schemas.Accepted):
                        t_acc = t
                    elif isinstance(event, schemas.Chunk) and t_chunk is None:
                        t_chunk, carried = t, event.accepted is not None
                    if isinstance(event, schemas.TERMINAL_EVENTS):
                        if t_chunk is None:
                            raise RuntimeError(f"request {i} ended without a token: {event}")
                        ended = True
            if i >= warmup:
                rows.append(((t_acc - t0) / 1e6, (t_chunk - t0) / 1e6, carried))
            await asyncio.sleep(1.0 / rate)
    finally:
        await nc.close()
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tokenyard.launcher import FleetProcesses

    async with FleetProcesses(workers=args.workers, profile="zero", http_port=0, model=args.model) as fleet:
        rows = await measure(fleet.nats_url, args.model, args.requests, args.rate, args.warmup)
    return summary(rows)


def main(argv: list[str] | None = None) -> int:
    from tokenyard.shared import config

    p = argparse.ArgumentParser(prog="python -m bench.accepted_wait", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2,
                   help="zero-latency worker processes in the fleet this bench starts (default: %(default)s)")
    p.add_argument("--model", default=config.DEFAULT_MODEL, help="model name every request asks for (default: %(default)s)")
    p.add_argument("--requests", type=int, default=300, help="requests measured, after the warm-up (default: %(default)s)")
    p.add_argument("--rate", type=float, default=20.0, help="requests a second, one at a time")
    p.add_argument("--warmup", type=int, default=20, help="requests sent first and left out of the result (default: %(default)s)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    result = asyncio.run(run(args))
    result["load_avg"] = {"before": load_before, "after": os.getloadavg()}
    held = result["held_waiting_for_accepted_ms"]
    print(f"{result['requests']} requests: the first chunk came before `accepted` in "
          f"{result['first_chunk_before_accepted']}; a client waiting for `accepted` holds it "
          f"p50 {held['p50']:.3f} / p90 {held['p90']:.3f} / p99 {held['p99']:.3f} / mean {held['mean']:.3f} ms")
    print(f"first chunk carries the acceptance: {result['first_chunk_carries_acceptance']} of {result['requests']}; "
          f"TTFT p50 {result['ttft_p50_ms']['client_waits_for_accepted']:.2f} ms waiting for `accepted`, "
          f"{result['ttft_p50_ms']['first_chunk_as_it_arrives']:.2f} ms as the chunk arrives")
    print(f"load average before {load_before[0]:.2f}, after {result['load_avg']['after'][0]:.2f}")
    write_result(args.json, result, prog="python -m bench.accepted_wait", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
