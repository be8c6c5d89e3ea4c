"""A hand-over too big for one NATS message goes in pieces (shared/adoption.py): live, on a
secured nats-server of this module's own whose max_payload is 32 KiB. One worker; router A
places 12 streams whose prompts and resumed tokens (~9 KB a request encoded, ~4.5 KB of state
each) make an AdoptAsk of ~110 KB; router B starts; A's connection closes. The worker hands all
12 to B, in several asks that each fit the room, and follows B for every one. (In one message
the ask raised MaxPayloadError at every probe and nothing was ever adopted.)"""

from __future__ import annotations

import pytest
from tokenyard.shared import codec, config, nats_auth, natsutil
from tokenyard.shared.adoption import AdoptAsk, message_room

from tests import adoption_fleet
from tests.builders import req
from tests.conftest import until

MAX_PAYLOAD = 32 * 1024
STREAMS = 12
N = 1500
"""Prompt and resumed token ids per request (3 bytes each in MessagePack)."""


@pytest.fixture(scope="module")
async def small_nats(tmp_path_factory):
    auth = nats_auth.FleetAuth.generate(tmp_path_factory.mktemp("small-creds"))
    server = await natsutil.NatsServer(auth=auth, max_payload=MAX_PAYLOAD).start()
    yield server
    server.stop()


async def test_a_hand_over_bigger_than_max_payload_goes_in_pieces_and_every_stream_is_adopted(small_nats):
    af = await adoption_fleet.start(small_nats.url, "pw0", "_INBOX.payloadclient")
    worker, router_a, asks = af.worker, af.router_a, af.asks
    reqs = [req(f"big-{i}", tokens=range(1000, 1000 + N), max_tokens=4 * N, reply_to=f"_INBOX.payloadclient.{i}",
                model=config.DEFAULT_MODEL, resume_token_ids=list(range(2000, 2000 + N)), resume_seq=N, migrations=1)
            for i in range(STREAMS)]
    assert len(codec.encode(AdoptAsk("pw0", reqs))) > 3 * MAX_PAYLOAD  # one message could not carry it
    try:
        await adoption_fleet.place(af, reqs, 60)
        router_b = await af.fleet.add(adoption_fleet.router())
        await until(lambda: "pw0" in router_b.shell.core.view.ids, 10, what="router B hears the worker")
        placed_by = {st.placed_by for st in worker.shell.core.streams.values()}
        assert len(placed_by) == 1 and "" not in placed_by  # router A's `alive` subject
        await router_a.nc.close()  # router A is gone from the bus
        b = router_b.shell
        await until(lambda: all(ar.request_id in b.migration.tracked for ar in reqs), 60, 0.05,
                    what="the worker hands every stream to router B")
        assert set(b.following) >= {ar.request_id for ar in reqs}
        await until(lambda: not {st.placed_by for st in worker.shell.core.streams.values()} & placed_by, 10,
                    what="the worker to follow router B for every stream")  # B commits before its last reply lands
        followed = {st.placed_by for st in worker.shell.core.streams.values()}
        assert len(followed) == 1 and followed != placed_by  # every stream now router B's
        assert len(asks) >= 3 and all(len(a) <= message_room(MAX_PAYLOAD) for a in asks)
        assert sorted(r.request_id for a in asks for r in codec.decode(a, AdoptAsk).requests) == sorted(
            ar.request_id for ar in reqs)
    finally:
        await adoption_fleet.stop(af, reqs)
