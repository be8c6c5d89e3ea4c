"""One open-loop HTTP load generator process for the overload probe (several run side by side,
so the offered rate is not capped by one Python process):

    python -m bench.faults.generator URL RATE SECONDS DRAIN_S SEED [TPOT_SLO_MS]

sends RATE requests/s for SECONDS (10 % bad bodies), waits up to DRAIN_S for the answers,
gives up on the rest (disconnects: the edge aborts them) and prints one JSON line: sent,
offered_rps, statuses (HTTP status, `200+error` for a stream that ended in an error frame, or
the client's own failure), ok_second_half (200s that completed in the second half of the
load: the fleet's throughput once saturated), first_refusal_s (when the first 429/503 answer came,
from the generator's start) and refusal_s (how long refusals took to answer: p50, p99, max)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter

import aiohttp

BAD_BODIES = (b'{"model": "tokenyard-sim", "prompt": ', b'{"prompt": "x", "max_tokens": -1}',
              b'{"prompt": 5}', b"[" * 1000 + b"]" * 1000, b'{"prompt": "x", "max_tokens": 1e30}')
TOKENS = 64
"""Output length of every good request (the probe's capacity is measured with the same)."""


def body(i: int, tpot_slo_ms: float | None = None) -> dict:
    return {"model": "tokenyard-sim", "prompt": f"load {i} " * 32, "max_tokens": TOKENS, "ignore_eos": True,
            "stream": i % 2 == 0, **({"tpot_slo_ms": tpot_slo_ms} if tpot_slo_ms else {})}


REFUSALS = (429, 503)


async def one(http: aiohttp.ClientSession, url: str, i: int, bad: bool = False,
              tpot_slo_ms: float | None = None, took: list | None = None) -> int | str:
    """POST one request; its status. `took`, if given, gets (answered at, seconds) of a refusal."""
    sent = time.monotonic()
    status = await _post(http, url, i, bad, tpot_slo_ms)
    if took is not None and status in REFUSALS:
        now = time.monotonic()
        took.append((now, now - sent))
    return status


async def _post(http: aiohttp.ClientSession, url: str, i: int, bad: bool, tpot_slo_ms: float | None) -> int | str:
    try:
        if bad:
            data = BAD_BODIES[i % len(BAD_BODIES)]
            async with http.post(url, data=data, headers={"content-type": "application/json"}) as r:
                await r.read()
                return r.status
        async with http.post(url, json=body(i, tpot_slo_ms)) as r:
            data = await r.read()
            if r.status == 200 and b'"error"' in data:  # an SSE stream that ended in an error frame
                return "200+error"
            return r.status
    except Exception as e:  # the load generator's own failure, by kind
        return type(e).__name__


async def open_loop(url: str, rate: float, seconds: float, drain_s: float, seed: int,
                    tpot_slo_ms: float | None = None) -> dict:
    statuses: Counter = Counter()
    ok_second_half = 0
    tasks: set[asyncio.Task] = set()
    refusals: list[tuple[float, float]] = []
    rng = random.Random(seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as http:
        start = time.monotonic()

        def done(t: asyncio.Task) -> None:
            nonlocal ok_second_half
            tasks.discard(t)
            result = "gave_up" if t.cancelled() else t.result()
            statuses[result] += 1
            ok_second_half += result == 200 and seconds / 2 <= time.monotonic() - start <= seconds

        i = 0
        while (now := time.monotonic()) - start < seconds:
            while i < int((now - start) * rate):
                t = asyncio.create_task(one(http, url, seed * 10_000_000 + i, bad=rng.random() < 0.1,
                                             tpot_slo_ms=tpot_slo_ms, took=refusals))
                t.add_done_callback(done)
                tasks.add(t)
                i += 1
            await asyncio.sleep(0.01)
        sent_s = time.monotonic() - start
        if tasks:
            await asyncio.wait(set(tasks), timeout=drain_s)
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
    took = sorted(t for _, t in refusals)
    return {"sent": i, "offered_rps": round(i / sent_s, 1), "statuses": {str(k): v for k, v in statuses.items()},
            "ok_second_half": ok_second_half,
            "first_refusal_s": round(min(at for at, _ in refusals) - start, 3) if refusals else None,
            "refusal_s": {"n": len(took), "p50": round(took[len(took) // 2], 3), "p99": round(took[int(len(took) * 0.99)], 3),
                          "max": round(took[-1], 3)} if took else None}


def main() -> None:
    url, rate, seconds, drain_s, seed = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5])
    tpot_slo_ms = float(sys.argv[6]) if len(sys.argv) > 6 else None
    print(json.dumps(asyncio.run(open_loop(url, rate, seconds, drain_s, seed, tpot_slo_ms))), flush=True)


if __name__ == "__main__":
    main()
