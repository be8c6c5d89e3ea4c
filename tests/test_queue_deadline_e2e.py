"""Over a real nats-server: a request that can no longer meet its TTFT deadline while the
queue holds it (here: no worker at all) gets `rejected` 429 deadline_exceeded on its stream,
its JetStream message is acked (not redelivered), and the queue holds nothing."""

from __future__ import annotations

import json
import time

from tokenyard.services.priority_queue.core import QueueConfig
from tokenyard.services.priority_queue.policies.registry import make_policy
from tokenyard.services.priority_queue.shell import QueueShell
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.service import ServiceHost

from tests import builders


async def test_a_request_past_its_deadline_is_rejected_with_a_429_and_acked(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-queue-deadline")
    await natsutil.ensure_queue_stream(nc)
    js = nc.jetstream()
    await js.purge_stream(subjects.QUEUE_STREAM)
    host = await ServiceHost(QueueShell(QueueConfig(), make_policy("hybrid")), nats_server.url).start()
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        now = time.time()
        req = builders.req("dl-1", 8, 4, 0, arrival_s=now, reply_to=inbox)  # P0: 0.5 s
        await js.publish(subjects.QUEUE, codec.encode(req), headers={"Nats-Msg-Id": req.request_id})
        event = codec.decode_event((await sub.next_msg(timeout=5)).data)
        waited = time.time() - now
        assert isinstance(event, schemas.Rejected)
        assert (event.request_id, event.status, event.code) == ("dl-1", 429, "deadline_exceeded")
        assert 0.25 <= waited < 1.5  # leaves once less than 0.25 s of its 0.5 s is left
        stats = json.loads((await nc.request(subjects.QUEUE_STATS, b"", timeout=2)).data)
        assert (stats["depth"], stats["held"]) == (0, 0)
        # received_ns (its arrival, kept for the route's span while spans are recorded): it was
        # left behind by every request that expired or was aborted while it waited
        assert stats["kept"] == {"local": 0, "stored": 0, "placing": 0, "routes": 0, "held": 0, "waiting": 0,
                                 "in_flight": 0, "received_ns": 0}
        info = await js.consumer_info(subjects.QUEUE_STREAM, subjects.QUEUE_CONSUMER)
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await host.stop()
        await js.purge_stream(subjects.QUEUE_STREAM)
        await nc.drain()
