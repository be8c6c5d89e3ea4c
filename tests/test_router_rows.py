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



def test_the_offer_carries_rs_uncached_tokens_on_the_choice_and_the_fewest_on_any_other():
    """Choice.prefill (the offer's Tokenyard-Prefill header): the worker's `saturated` refusal
    weighs r's recompute here against the least it would recompute elsewhere. A worker that
    refused r no longer counts as elsewhere; with no other worker there is nothing to weigh."""
    r = router("marginal-latency")
    for wid in ("w0", "w1", "w2"):
        r.on_heartbeat(hb(wid), 0.0)
    tokens = list(range(64))
    chain = hashing.hash_chain(tokens, 16)
    r.on_kv_events("w1", KVEventBatch(ts=0.0, events=[BlockStored(chain[:3], None, tokens[:48], 16)]), 0.0)
    r.on_kv_events("w2", KVEventBatch(ts=0.0, events=[BlockStored(chain[:1], None, tokens[:16], 16)]), 0.0)
    choice = r.route(req("a", tokens=tokens), 0.0)
    assert choice.worker_id == "w1" and choice.prefill == (16, 48)  # w2 holds one block: 48 to go there
    # w1 refused it: the next choice is w2, and the fewest elsewhere is now w0's whole prompt
    again = r.route(req("a", tokens=tokens), 0.0, exclude=frozenset({"w1"}))
    assert again.worker_id == "w2" and again.prefill == (48, 64)
    alone = router("marginal-latency")
    alone.on_heartbeat(hb("w0"), 0.0)
    assert alone.route(req("b", tokens=tokens), 0.0).prefill is None
