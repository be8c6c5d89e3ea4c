"""RouterCore.rows: the latest decision's inputs row by row, which the router shell writes in
its `route_choice` debug line (TOKENYARD_LOG_LEVEL=debug; bench.live_router --route-log reads
them back to say which worker held how much of each request and how loaded each looked)."""

from __future__ import annotations

import json

from tokenyard.shared import hashing
from tokenyard.shared.schemas import BlockStored, KVEventBatch

from tests.builders import hb, req
from tests.router_fakes import router


def test_rows_are_the_decisions_hits_loads_and_queues_by_worker():
    r = router("marginal-latency")
    r.on_heartbeat(hb("w0", running=1), 0.0)
    r.on_heartbeat(hb("w1", running=4, waiting=1, queued=300), 0.0)
    tokens = list(range(64))
    chain = hashing.hash_chain(tokens, 16)
    r.on_kv_events("w1", KVEventBatch(ts=0.0, events=[BlockStored(chain[:3], None, tokens[:48], 16)]), 0.0)
    choice = r.route(req("a", tokens=tokens), 0.0)
    rows = r.rows()
    assert rows["workers"] == ["w0", "w1"]
    assert rows["hit"] == [0, 48]  # three blocks of 16 on w1, nothing on w0
    chosen = rows["workers"].index(choice.worker_id)
    # the chosen row already counts the request (note_routed): one more waiting, its new tokens queued
    expect_load, expect_queued = {"w0": ([2, 5], [64.0, 300.0]), "w1": ([1, 6], [0.0, 316.0])}[choice.worker_id]
    assert (rows["load"], rows["queued"]) == (expect_load, expect_queued)
    assert rows["hit"][chosen] == choice.hit_tokens
    json.dumps(rows)  # plain lists and numbers: a log line as it is

