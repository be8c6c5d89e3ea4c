"""How long tokenyard's JetStream queue stream stops taking requests when the cluster node that
leads it is SIGKILLed, on a 3-node loopback cluster (shared/nats_cluster.py).

Each trial: publish to the R3 queue stream every 20 ms (0.25 s per attempt) from a client on
another node; SIGKILL the stream leader's node; time until the first publish is acknowledged
again, and from which leader. The node is restarted between trials (it rejoins and catches up).
This is the window admission's `publish_durably` (shared/natsutil.py, 20 s deadline) rides out.

    python bench/nats_failover.py --trials 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from tokenyard.shared import natsutil, subjects
from tokenyard.shared.nats_cluster import NatsCluster


async def leader_of(nc) -> int:
    info = await nc.jetstream().stream_info(subjects.QUEUE_STREAM)
    return int(info.cluster.leader.rsplit("n", 1)[1])


async def trial(cluster: NatsCluster, k: int) -> tuple[float, int, int]:
    probe = await natsutil.connect(cluster.url, "probe")
    victim = await leader_of(probe)
    await probe.close()
    nc = await natsutil.connect(cluster.urls[(victim + 1) % cluster.size], "publisher")
    js = nc.jetstream()
    cluster.kill(victim)
    killed = time.perf_counter()
    i = 0
    while True:
        i += 1
        try:
            await js.publish(subjects.QUEUE, b"x", headers={"Nats-Msg-Id": f"t{k}-{i}"}, timeout=0.25)
            break
        except Exception:
            await asyncio.sleep(0.02)
    gap = time.perf_counter() - killed
    new_leader = await leader_of(nc)
    await nc.jetstream().purge_stream(subjects.QUEUE_STREAM)
    await nc.close()
    cluster.restart(victim)
    await cluster.wait_ready(60)
    return gap, victim, new_leader


async def main(trials: int) -> None:
    async with NatsCluster(3) as cluster:
        nc = await natsutil.connect(cluster.url, "setup")
        await natsutil.ensure_queue_stream(nc)
        await nc.close()
        gaps = []
        for k in range(trials):
            gap, old, new = await trial(cluster, k)
            gaps.append(gap)
            print(f"trial {k}: leader n{old} SIGKILLed, publishes acknowledged again after {gap:.2f} s (leader n{new})")
        print(f"unavailable: median {statistics.median(gaps):.2f} s, max {max(gaps):.2f} s over {trials} trials")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5,
                    help="leader kills, each followed by a restart of the killed node (default: %(default)s)")
    asyncio.run(main(ap.parse_args().trials))
