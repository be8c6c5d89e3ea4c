"""The hot-spot detector: stage 1's statistic over its window, stage 2's run of choices and
cool-down, the round-robin fallback; then the whole loop through RouterCore."""

from __future__ import annotations

from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.hotspot import HotspotConfig, HotspotDetector
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import AdmittedRequest, BlockStored, KVEventBatch

from tests import builders
from tests.builders import hb


def detector(**kw) -> HotspotDetector:
    return HotspotDetector(HotspotConfig(**kw))


def test_stage_one_compares_the_prefix_share_of_requests_with_its_share_of_instances():
    d = detector(min_requests=20)
    for k in range(19):
        d.observe("A" if k % 2 else "B", float(k))
    assert not d.warning("A", 1, 4)  # 19 requests: not yet a statistic
    d.observe("A", 19.0)
    # x / x̄ = 10 / 20 against |M| / |M̄|: 1 / 4 → warn, 2 / 4 → not (equal), 3 / 4 → not
    assert [d.warning("A", m, 4) for m in (1, 2, 3)] == [True, False, False]
    assert not d.warning("A", 0, 4)  # nobody holds it: nothing to protect
    assert not d.warning(None, 1, 4)
    assert not d.warning("C", 1, 4)  # never seen


def test_the_window_forgets_requests_older_than_a_minute():
    d = detector(min_requests=1)
    for _ in range(10):
        d.observe("A", 0.0)
    d.observe("B", 60.0)  # A's are exactly one window old: still in
    assert d.warning("A", 1, 2)
    d.observe("B", 60.5)  # now they are out: x = 0
    assert not d.warning("A", 1, 2)
    assert d.warning("B", 1, 2)


def test_stage_two_filters_an_instance_chosen_two_m_times_in_a_row():
    d = detector(cooldown_s=10.0)
    assert not d.record("A", "w0", True, 2, 0.0)
    assert not d.record("A", "w0", True, 2, 0.1)
    assert not d.record("A", "w1", True, 2, 0.2)  # the run restarts
    assert not d.record("A", "w1", False, 2, 0.3)  # no warning: the run is dropped
    for k in range(3):
        assert not d.record("A", "w1", True, 2, 1.0 + k)
    assert d.record("A", "w1", True, 2, 4.0)  # 4 = 2 × |M| in a row
    assert (d.fired, d.blocked("A", 4.0), d.blocked("B", 4.0)) == (1, ["w1"], [])
    assert d.blocked("A", 13.9) == ["w1"]
    assert d.blocked("A", 14.0) == []
    assert not d.record(None, "w1", True, 2, 5.0)


def test_a_prefix_that_leaves_the_window_leaves_no_state():
    d = detector(cooldown_s=100.0)
    d.observe("A", 0.0)
    d.record("A", "w0", True, 1, 0.0)
    d.record("B", "w0", True, 1, 0.0)
    d.record("B", "w0", True, 1, 0.0)  # B fires: cooled down until 100
    d.observe("B", 0.0)
    d.observe("C", 61.0)  # A and B leave the window
    assert d.kept() == {"counted": 1, "streaks": 0, "cooling": 1}  # C; B's cool-down is not spent yet
    assert d.blocked("B", 61.0) == ["w0"]
    d.observe("C", 200.0)
    assert d.kept() == {"counted": 1, "streaks": 0, "cooling": 0}  # C alone, B's cool-down gone with it
    assert d.blocked("B", 99.0) == []  # gone, not merely spent (until 100 it would still hold)


def test_the_fallback_holds_while_the_detector_keeps_firing():
    d = detector(cooldown_s=1.0, fallback_after=3, fallback_window_s=60.0, fallback_for_s=30.0)
    fire = [d.record("A", "w0", True, 1, t) or d.record("A", "w0", True, 1, t) for t in (0.0, 50.0)]
    assert fire == [True, True] and not d.fallback(50.0)
    d.record("B", "w3", True, 1, 100.0)
    assert d.record("B", "w3", True, 1, 100.0)  # the first firing (t = 0) has left the window
    assert not d.fallback(100.0)
    d.record("C", "w2", True, 1, 101.0)
    assert d.record("C", "w2", True, 1, 101.0)  # three within a minute: 50, 100, 101
    assert d.fallback(101.0) and d.fallback(130.9) and not d.fallback(131.0)


# ───────────────────────────── through the core ─────────────────────────────

HOT = ids_chain([1, 2])


def hot_request(k: int) -> AdmittedRequest:
    chain = ids_chain([1, 2, 1000 + k, 2000 + k])  # the hot 2-block prefix, then its own blocks
    assert chain[:2] == HOT
    return builders.req(f"q{k}", 64, 8, 1, chain=chain, reply_to="")


def test_a_hot_prefix_spreads_and_the_fallback_takes_over():
    cfg = HotspotConfig(min_requests=4, cooldown_s=100.0, fallback_after=2)
    c = RouterCore(RouterConfig(policy="multiplicative", hotspot=cfg, stale_after_s=1e9))
    workers = ["w0", "w1", "w2", "w3"]

    def store(wid, chain):
        ev = BlockStored(block_hashes=list(chain), parent_block_hash=None, token_ids=[], block_size=16)
        c.on_kv_events(wid, KVEventBatch(0.0, [ev]), 0.0)

    for w in workers:
        store(w, [])
    store("w0", HOT)
    picks = []
    for k in range(12):
        for w in workers:  # a heartbeat round before each request: the optimistic +1s are gone
            c.on_heartbeat(hb(w, running=10, seq=k), float(k))
        ch = c.route(hot_request(k), float(k))
        picks.append((ch.worker_id, ch.hot_warning, ch.fallback))
        if ch.worker_id != "w0":
            store(ch.worker_id, HOT)  # its prefill cached the hot prefix
    # w0 holds the prefix: P = 32 × 11 = 352 against 64 × 11 = 704 elsewhere. From the 4th
    # request the window has 4 hot requests (4/4 > 1/4): warning; 2 × |M| = 2 in a row fire;
    # w0 is cooled down, w1 takes over and caches it (|M| = 2: 4 in a row), fires again:
    # two firings within a minute → round robin (over w2, w3: w0 and w1 are cooling) for 30 s.
    assert picks == [
        ("w0", False, ""),
        ("w0", False, ""),
        ("w0", False, ""),
        ("w0", True, ""),
        ("w0", True, ""),
        ("w1", True, ""),
        ("w1", True, ""),
        ("w1", True, ""),
        ("w1", True, ""),
        ("w2", True, "round-robin"),
        ("w3", True, "round-robin"),
        ("w2", False, "round-robin"),  # all four hold it now (4/4 is not > 4/4); w0, w1 still cool
    ]
    assert c.detector.fired == 2
