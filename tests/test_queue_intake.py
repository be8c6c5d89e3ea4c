"""The queue's intake (services/priority_queue/intake.py): a stored message no router can place
is refused once — terminated, its client told with a 400 — instead of being put back in line
after each refused route for ever; the fleet serves on."""

from __future__ import annotations

import time

from tokenyard.services.priority_queue import intake
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.builders import req
from tests.conftest import until


def test_check_takes_a_sane_request_and_names_what_is_wrong_with_the_others():
    sane = req("sane", prompt_len=100, chain=[1, 2, 3])
    got, why = intake.check(codec.encode(sane))
    assert (got.request_id, got.block_hashes, why) == ("sane", [1, 2, 3], None)
    hostile = req("hostile", prompt_len=100, block_size=-5, chain=[1, 2, 3])
    got, why = intake.check(codec.encode(hostile))
    assert got.request_id == "hostile" and why == "block_size -5 is not in [1, 65536]"
    got, why = intake.check(b"\x93\x01\x02")
    assert got is None and why.startswith("undecodable: ")


async def test_a_stored_request_no_router_can_place_is_refused_once_and_the_fleet_serves_on(fleet):
    nc = fleet.nats
    inbox = nc.new_inbox()
    events: list = []

    async def on_event(msg) -> None:
        events.append(codec.decode_event(msg.data))

    await nc.subscribe(inbox, cb=on_event)
    hostile = req("hostile-1", prompt_len=100, block_size=2**40, chain=[1, 2, 3], reply_to=inbox,
                  arrival_s=time.time())
    await nc.jetstream().publish(subjects.QUEUE, codec.encode(hostile))
    await until(lambda: events, what="the hostile request's answer")
    assert events == [schemas.Error("hostile-1", 400, "bad request: block_size 1099511627776 is not in [1, 65536]")]

    async def stream_empty() -> bool:
        return (await nc.jetstream().stream_info(subjects.QUEUE_STREAM)).state.messages == 0

    await until(stream_empty, what="the hostile message leaves the stream")
    done = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="after", max_tokens=2))
    assert done.finish_reason == "length"
    assert events == [schemas.Error("hostile-1", 400, "bad request: block_size 1099511627776 is not in [1, 65536]")]
