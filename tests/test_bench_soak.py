"""bench/soak.py: its verdict from hand-made samples (growth per 1,000 requests after the first
phase, `grows` only for steady growth past the threshold, the counts not back at idle named),
how it reads `$SRV.STATS`, its seeded load, and one tiny live soak on a real fleet."""

from __future__ import annotations

import argparse

from bench.soak import GROWS_MB_PER_1K, MIX, Soak, flat, growth, not_idle, plan, process_of, verdict


def sample(phase: int, rss: dict[str, float], ended: int, not_back: dict | None = None) -> dict:
    return {"phase": phase, "rss_mb": rss, "remembered": {"router.ended": [ended, 50_000]},
            "kept": {}, "not_idle": not_back or {}}


def test_growth_is_per_thousand_requests_and_grows_only_when_steady_and_past_the_threshold():
    assert growth([100.0, 101.0, 102.0], 2000) == {"per_1k": 0.5, "phases": [0.5, 0.5], "grows": False}
    assert growth([100.0, 101.5, 103.0], 1000) == {"per_1k": 1.5, "phases": [1.5, 1.5], "grows": True}
    # up 4 MB, then down 1: one step of the allocator, not a leak
    assert growth([100.0, 104.0, 103.0], 1000) == {"per_1k": 1.5, "phases": [4.0, -1.0], "grows": False}
    assert GROWS_MB_PER_1K == 0.5


def test_the_verdict_leaves_the_first_phase_out_and_names_what_did_not_come_back():
    samples = [  # the first, a warm-up: its jump is not counted
        sample(1, {"queue": 190.0, "worker-0": 70.0, "nats-server": 20.0}, 1000),
        sample(2, {"queue": 191.0, "worker-0": 70.5, "nats-server": 21.0}, 2000),
        sample(3, {"queue": 193.0, "worker-0": 70.4, "nats-server": 22.0}, 3000, {"router.tracked": [0, 13]}),
        sample(4, {"queue": 195.0, "worker-0": 70.6, "nats-server": 23.0}, 3500,
               {"router.tracked": [0, 20], "edge.streams": [0, 1]}),
    ]
    v = verdict(samples, 1000)
    # the queue's process holds the router: its memory still filling accounts for its growth
    assert v["rss"]["queue"] == {"per_1k": 2.0, "phases": [2.0, 2.0], "grows": True, "filling": ["router.ended"]}
    assert v["rss"]["worker-0"] == {"per_1k": 0.05, "phases": [-0.1, 0.2], "grows": False, "filling": []}
    assert v["rss"]["nats-server"]["grows"] and v["growing"] == ["nats-server"]
    assert v["remembered"]["router.ended"] == {"per_1k": 750.0, "phases": [1000.0, 500.0], "grows": True,
                                               "bound": 50_000}
    assert v["kept_not_back"] == ["edge.streams", "router.tracked"]
    assert v["not_idle"] == {3: {"router.tracked": [0, 13]}, 4: {"router.tracked": [0, 20], "edge.streams": [0, 1]}}


def test_counts_belong_to_the_processes_of_ups_layout():
    assert [process_of(c) for c in ("router.ended", "admission.tenant_buckets", "edge.streams", "w1.seen")] == [
        "queue", "queue", "queue", "worker-1"]
    assert process_of("edge.streams", edge_processes=1) == "edge" and process_of("macro.x") == "macro"


def test_stats_replies_are_read_by_service_and_worker_id():
    replies = [
        {"name": "tokenyard-router", "metadata": {"instance": "router-1"},
         "endpoints": [{"data": {"decisions": {"x": 1}, "kept": {"tracked": 2, "follows": 2},
                                 "remembered": {"ended": [7, 50_000], "leases": [1, None]}}}]},
        {"name": "tokenyard-worker", "metadata": {"instance": "w0"},
         "endpoints": [{"data": None}, {"data": {"kept": {"streams": 0}, "remembered": {"seen": [3, 50_000]}}}]},
        {"name": "tokenyard-macro", "metadata": {"instance": "macro-1"}, "endpoints": [{"data": {"migrations": 0}}]},
    ]
    kept, remembered = flat(replies)
    assert kept == {"router.follows": 2, "router.tracked": 2, "w0.streams": 0}
    assert remembered == {"router.ended": [7, 50_000], "router.leases": [1, None], "w0.seen": [3, 50_000]}
    assert not_idle({"router.follows": 0, "router.tracked": 0, "w0.streams": 0}, kept) == {
        "router.follows": [0, 2], "router.tracked": [0, 2]}


def test_the_load_is_seeded_mixed_and_vanishes_over_nats_only():
    a, b = plan(7, 2000), plan(7, 2000)
    assert a == b and a != plan(8, 2000)
    kinds = {k: sum(p.kind == k for p in a) for k in MIX}
    for kind, share in MIX.items():
        assert abs(kinds[kind] / 2000 - share) < 0.03, kind
    assert {p.via for p in a if p.kind == "vanished"} == {"nats"}
    assert {p.via for p in a if p.kind == "completed"} == {"nats", "http"}


async def test_a_tiny_live_soak_comes_back_to_idle_after_every_phase():
    args = argparse.Namespace(phases=3, requests=40, concurrency=8, workers=1, speed=20.0, edge_processes=0,
                              seed=3, baseline=None, log_dir=None, json=None)
    doc = await Soak(args).run()
    assert [s["phase"] for s in doc["samples"]] == ["idle", 1, 2, 3]
    assert doc["baseline"] and set(doc["baseline"].values()) == {0}
    assert doc["verdict"]["kept_not_back"] == []
    for s in doc["samples"][1:]:
        assert s["kept"] == doc["baseline"] and s["idle_after_s"] < 30
        assert set(s["rss_mb"]) == {"nats-server", "queue", "macro", "worker-0"}
    tally = doc["tally"]
    assert sum(tally.values()) >= 3 * 40
    unexpected = {k: n for k, n in tally.items()
                  if k.split(": ")[1] not in ("finished", "200", "left", "400", "rejected 400", "409", "rejected 409")}
    assert unexpected == {}
    assert tally.get("resubmitted nats again: rejected 409", 0) + tally.get("resubmitted http again: 409", 0) > 0
