"""A handed-over request's stored copy is deleted at most once, and not by its taker when the
copy came to the taker itself (which acked it): round 8's queue-replica-kill logged 142 deletes
that found nothing. On a real nats-server, admission, queue and router in one process, the
store's ack held back until the copy had come and been acked."""

from __future__ import annotations

from tokenyard.shared import schemas
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tests.fault_fleet import stop_fleet, worker
from tests.test_queue_with_admission import start, stored


async def test_a_copy_acked_by_its_taker_before_its_store_ack_is_not_deleted_again(nats_server):
    fleet = await start(nats_server.url, [worker("cw0")])
    queue = fleet.queue
    late: list[tuple[str, int]] = []
    on_stored = queue.stored
    queue.stored = lambda rid, seq: late.append((rid, seq))  # the store's ack, held back
    client = await TokenyardClient.connect(nats_server.url)
    try:
        done = await client.generate(schemas.GenerateRequest(prompt="copy once", max_tokens=3))
        assert done.finish_reason == "length"
        await until(lambda: late, what="the store's ack")
        await until(_empty(nats_server.url), what="its copy came here and was acked")
        assert queue.kept()["held"] == queue.kept()["local"] == 0
        for rid, seq in late:
            on_stored(rid, seq)  # now the ack comes: the copy is gone already
        await queue.copies.close()
        assert queue.copies.sent == 0  # main: 1, a delete that found nothing (10057)
    finally:
        await client.close()
        await stop_fleet(fleet.hosts)


def _empty(url: str):
    async def check() -> bool:
        return await stored(url) == 0
    return check
