"""How often a message published right after another connection's subscribe is lost.

    python -m bench.sub_race [--rounds 3000] [--wait-ms 500]

Connection A subscribes to a fresh subject; connection B publishes on it at once; was it
heard within `--wait-ms`? Three ways for A to make sure first: `none` (nothing: the SUB is
still in nats-py's pending buffer when B publishes), `flush` (a bare nats-py `flush()`: its
PING is written straight to the socket, ahead of the pending SUB, so the PONG can come back
before the server has the SUB), `in-order` (the same flush on a connection given
`nats_internals.ping_after_pending`, as `natsutil.connect` gives every one: the SUB, then the PING).
Printed: messages lost of `--rounds` for each (`none` runs a tenth of the rounds: each loss
waits out `--wait-ms`). A nats-server of its own; no fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def lost(url: str, how: str, rounds: int, wait_s: float) -> int:
    import nats
    from tokenyard.shared import nats_internals

    a, b = await nats.connect(url), await nats.connect(url)
    if how == "in-order":
        nats_internals.ping_after_pending(a)
    missed = 0
    try:
        for i in range(rounds):
            heard = asyncio.Event()

            async def on_msg(_msg, heard=heard) -> None:
                heard.set()

            sub = await a.subscribe(f"bench.sub_race.{i}", cb=on_msg)
            if how != "none":
                await a.flush()
            await b.publish(f"bench.sub_race.{i}", b"x")
            await b.flush()
            try:
                await asyncio.wait_for(heard.wait(), wait_s)
            except TimeoutError:
                missed += 1
            await sub.unsubscribe()
    finally:
        await a.close()
        await b.close()
    return missed


async def run(rounds: int, wait_s: float) -> dict[str, tuple[int, int]]:
    from tokenyard.shared import natsutil

    server = await natsutil.NatsServer().start()
    try:
        out = {}
        for how, n in (("none", max(1, rounds // 10)), ("flush", rounds), ("in-order", rounds)):
            out[how] = (await lost(server.url, how, n, wait_s), n)
        return out
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sub_race", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3000, help="subscribe-then-publish rounds per way (none: a tenth)")
    p.add_argument("--wait-ms", type=float, default=500.0, help="how long a message may take before it counts as lost")
    args = p.parse_args(argv)
    for how, (missed, n) in asyncio.run(run(args.rounds, args.wait_ms / 1e3)).items():
        print(f"{how:>8}: {missed} lost of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
