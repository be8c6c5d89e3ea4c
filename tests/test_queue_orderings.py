"""Each queue policy's own ordering, with exact expected sequences (the shared contract is
in tests/test_queue_policies.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.priority_queue.policies.bubble import BubbleLine
from tokenyard.services.priority_queue.policies.drr import DRR
from tokenyard.services.priority_queue.policies.hybrid import hybrid, wfq
from tokenyard.services.priority_queue.policies.keeps_turn import KeepsTurn
from tokenyard.services.priority_queue.policies.registry import make_policy, parse_aging
from tokenyard.services.priority_queue.policies.strict import Strict

from tests.builders import req
from tests.test_queue_policies import drain


def push_all(p, reqs, now=0.0):
    for r in reqs:
        p.push(r, now)


# ───────────────────────────── strict ─────────────────────────────


def test_strict_serves_classes_in_order_then_least_deadline():
    p = Strict()
    push_all(p, [req("p3", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), req("p1-late", arrival_s=2.0, priority=1, prompt_len=32, max_tokens=16), req("p1", arrival_s=1.0, priority=1, prompt_len=32, max_tokens=16), req("p0", arrival_s=3.0, priority=0, prompt_len=32, max_tokens=16)])
    dl = req("p1-deadline", arrival_s=5.0, priority=1, prompt_len=32, max_tokens=16)
    dl.deadline_s = 5.1  # earlier than p1's implicit 1.0 + 5 s
    p.push(dl, 5.0)
    assert drain(p) == ["p0", "p1-deadline", "p1", "p1-late", "p3"]


def test_strict_pop_realtime_only_releases_p0():
    p = Strict()
    push_all(p, [req("a", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("b", arrival_s=1.0, priority=0, prompt_len=32, max_tokens=16)])
    assert p.pop_realtime(0.0).request_id == "b"
    assert p.pop_realtime(0.0) is None
    assert len(p) == 1


# ───────────────────────────── hybrid / wfq ─────────────────────────────


def test_hybrid_p0_strict_then_wfq_then_best_effort():
    p = hybrid()
    push_all(p, [req("p3", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), req("p2", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16), req("p1", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("p0", arrival_s=0.0, priority=0, prompt_len=32, max_tokens=16)])
    # P1's tag 48/8 = 6 beats P2's 48/4 = 12; P3 only once nothing above waits
    assert drain(p, 0.0) == ["p0", "p1", "p2", "p3"]


def test_hybrid_wfq_gives_p1_twice_p2s_share_of_equal_costs():
    p = hybrid(fair_order="wfq")
    push_all(p, [req(f"a{i}", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16) for i in range(6)] + [req(f"b{i}", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16) for i in range(3)])
    # tags: P1 6, 12, 18, 24, 30, 36; P2 12, 24, 36; ties go to the lower class
    assert drain(p, 0.0) == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2"]


def test_wfq_weighs_cost_not_count():
    p = hybrid(fair_order="wfq")
    # one P1 request of 800 tokens (tag 100) against P2 requests of 48 (tags 12, 24, …)
    push_all(p, [req("big", arrival_s=0.0, priority=1, prompt_len=784, max_tokens=16)] + [req(f"s{i}", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16) for i in range(9)])
    assert drain(p, 0.0) == ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "big", "s8"]


def test_deadline_first_serves_p1_before_a_p2_with_a_minute_of_slack():
    p = hybrid()
    push_all(p, [req(f"a{i}", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16) for i in range(6)] + [req(f"b{i}", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16) for i in range(3)])
    # releases: P1 0 + 5 − 0.25 = 4.75, P2 59.75; WFQ would have put b0 third
    assert drain(p, 0.0) == ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2"]


def test_deadline_first_serves_a_p2_whose_release_comes_first():
    p = hybrid()
    push_all(p, [req("p2-old", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16),
                 req("p1-new", arrival_s=56.0, priority=1, prompt_len=32, max_tokens=16)], 56.0)
    assert drain(p, 56.0) == ["p2-old", "p1-new"]  # 59.75 before 60.75


def test_release_counts_the_heads_own_prefill():
    p = hybrid(aging_s=None)
    long, short = req("p2-long", arrival_s=0.0, priority=2, prompt_len=30_000, max_tokens=16), req("p1", arrival_s=50.0, priority=1, prompt_len=32, max_tokens=16)
    long.deadline_s, long.prefill_s = 70.0, 12.0  # release 70 − 12 − 0.25 = 57.75
    short.deadline_s, short.prefill_s = 55.0, 0.01  # release 54.74: first
    push_all(p, [long, short], 50.0)
    assert drain(p, 50.0) == ["p1", "p2-long"]
    long2 = req("p2-long2", arrival_s=0.0, priority=2, prompt_len=30_000, max_tokens=16)
    long2.deadline_s, long2.prefill_s = 70.0, 16.0  # release 53.75: it must leave before the P1
    push_all(p, [long2, req("p1b", arrival_s=50.0, priority=1, prompt_len=32, max_tokens=16)], 50.0)
    assert drain(p, 50.0) == ["p2-long2", "p1b"]


def test_a_head_that_missed_its_release_yields_to_one_that_can_still_make_it():
    p = hybrid(aging_s=None)
    push_all(p, [req("p1-missed", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("p2", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16)])
    assert drain(p, 10.0) == ["p2", "p1-missed"]  # P1's release 4.75 passed; P2's 59.75 has not


def test_heads_that_all_missed_share_by_wfq_tags():
    p = hybrid(aging_s=None)
    push_all(p, [req(f"a{i}", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16) for i in range(6)] + [req(f"b{i}", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16) for i in range(3)])
    # at 100 s every deadline has passed: no EDF domino, the weighted shares of WFQ
    assert drain(p, 100.0) == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.floats(0.0, 80.0), st.integers(1, 4000), st.floats(0.0, 20.0)),
                min_size=1, max_size=40),
       st.floats(0.0, 90.0))
def test_deadline_first_pops_the_earliest_release_among_heads_that_can_still_make_it(reqs, now):
    """At every pop (no aging): if some fair class's head can still leave in time, the pop is
    the head with the earliest release; only when none can does a missed head go."""
    from tokenyard.services.priority_queue.policies.base import deadline as due
    from tokenyard.shared.slo import latest_release_s

    def release(r, c):
        return latest_release_s(due(r, c), r.prefill_s)

    p = hybrid(aging_s=None)
    for i, (c, arrival, length, prefill) in enumerate(reqs):
        p.push(req(f"r{i}", arrival_s=arrival, priority=c, prompt_len=length, max_tokens=16, prefill_s=prefill), now)
    popped = 0
    while len(p):
        heads = [(release(h, c), h.request_id) for c in (1, 2) if (h := p.lines[c].peek()) is not None]
        can = [h for h in heads if h[0] >= now]
        got = p.pop(now)
        popped += 1
        if can:
            assert got.request_id == min(can)[1] or release(got, got.priority) == min(can)[0]
        else:
            assert got.request_id in {rid for _, rid in heads}
    assert popped == len(reqs)


def test_wfq_policy_shares_among_all_four_classes():
    p = wfq()
    push_all(p, [req(f"c{c}-{i}", arrival_s=0.0, priority=c, prompt_len=32, max_tokens=16) for c in range(4) for i in range(8)])
    first = drain(p, 0.0)[:15]
    # weights 16/8/4/2 at cost 48: tags P0 3k, P1 6k, P2 12k, P3 24k
    assert [r.split("-")[0] for r in first] == [
        "c0", "c0", "c1", "c0", "c0", "c1", "c2", "c0", "c0", "c1", "c0", "c0", "c1", "c2", "c3"
    ]


def test_a_class_back_from_idle_banks_no_credit():
    p = hybrid(fair_order="wfq")
    push_all(p, [req(f"a{i}", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16) for i in range(4)])
    assert drain(p, 0.0) == ["a0", "a1", "a2", "a3"]  # V = 24
    push_all(p, [req("b0", arrival_s=1.0, priority=2, prompt_len=32, max_tokens=16), req("a4", arrival_s=1.0, priority=1, prompt_len=32, max_tokens=16), req("a5", arrival_s=1.0, priority=1, prompt_len=32, max_tokens=16)])
    # P2 re-enters at V: 24 + 12 = 36; P1 continues 30, 36 → a4, then a5 ties b0 and wins
    assert drain(p, 1.0) == ["a4", "a5", "b0"]


def test_aging_moves_a_request_up_one_class_per_threshold():
    p = hybrid(fair_order="wfq")
    p.push(req("old", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), 0.0)
    p.push(req("p2", arrival_s=4.0, priority=2, prompt_len=32, max_tokens=16), 4.0)
    assert p.class_of("old") == 3
    p.age_until(4.99)
    assert p.class_of("old") == 3
    p.age_until(5.0)
    assert p.class_of("old") == 2  # after 5 s in P3
    p.age_until(19.99)
    assert p.class_of("old") == 2
    p.age_until(20.0)  # 15 s in P2 (p2 arrived at 4: moves at 19)
    assert (p.class_of("old"), p.class_of("p2")) == (1, 1)
    p.age_until(1000.0)  # both climb to P0, each at its own time; nothing skips a class
    assert (p.class_of("old"), p.class_of("p2")) == (0, 0)
    assert p.promotions == 5  # old: 3 → 2 → 1 → 0; p2: 2 → 1 → 0
    assert drain(p, 1000.0) == ["old", "p2"]  # LDF in P0: deadline = arrival + 0.5


def test_deadline_first_aging_skips_the_fair_tier_and_keeps_its_thresholds():
    p = hybrid()
    p.push(req("old", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), 0.0)
    p.push(req("p2", arrival_s=4.0, priority=2, prompt_len=32, max_tokens=16), 4.0)
    p.push(req("p1", arrival_s=4.0, priority=1, prompt_len=32, max_tokens=16), 4.0)
    p.age_until(5.0)
    assert p.class_of("old") == 2  # best effort → fair after 5 s in P3
    p.age_until(48.99)
    assert [p.class_of(r) for r in ("old", "p2", "p1")] == [2, 2, 0]  # p1: 30 s in P1 at 34
    p.age_until(49.0)  # p2: 15 + 30 s after its arrival at 4
    assert [p.class_of(r) for r in ("old", "p2")] == [2, 0]
    p.age_until(50.0)  # old: 5 + 15 + 30
    assert p.class_of("old") == 0
    assert p.promotions == 4  # never into P1: an aged request's P1 target would be long past
    assert drain(p, 50.0) == ["old", "p1", "p2"]  # LDF in P0: deadlines 0.5, 4.5, 4.5 (arrival order)


def test_a_lazily_polled_queue_promotes_as_a_busy_one_would():
    lazy, busy = hybrid(fair_order="wfq"), hybrid(fair_order="wfq")
    for p in (lazy, busy):
        push_all(p, [req("x", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), req("y", arrival_s=10.0, priority=2, prompt_len=32, max_tokens=16)])
    for t in range(0, 53):
        busy.age_until(float(t))
    lazy.age_until(52.0)
    # x: P2 at 5, P1 at 20, P0 at 50; y (P2 from 10): P1 at 25, P0 only at 55
    assert [lazy.class_of(r) for r in "xy"] == [busy.class_of(r) for r in "xy"] == [0, 1]


def test_aging_can_be_turned_off_and_retuned():
    assert parse_aging("off") is None
    assert parse_aging("10,4,1") == (float("inf"), 10.0, 4.0, 1.0)
    p = hybrid(aging_s=parse_aging("10,4,1"))
    p.push(req("x", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), 0.0)
    p.age_until(15.0)  # 1 s in P3, 4 s in P2, 10 s in P1
    assert p.class_of("x") == 0
    q = hybrid(aging_s=None)
    q.push(req("x", arrival_s=0.0, priority=3, prompt_len=32, max_tokens=16), 0.0)
    q.age_until(1e9)
    assert q.class_of("x") == 3


def test_least_deadline_first_within_a_class():
    p = hybrid()
    late, urgent = req("late", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("urgent", arrival_s=3.0, priority=1, prompt_len=32, max_tokens=16)
    urgent.deadline_s = 3.2
    push_all(p, [late, urgent, req("plain", arrival_s=1.0, priority=1, prompt_len=32, max_tokens=16)])
    assert drain(p, 3.0) == ["urgent", "late", "plain"]


def test_hybrid_pop_realtime_takes_p0_only():
    p = hybrid()
    push_all(p, [req("a", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("b", arrival_s=0.0, priority=0, prompt_len=32, max_tokens=16)])
    assert p.pop_realtime(0.0).request_id == "b"
    assert p.pop_realtime(0.0) is None
    assert p.pop_realtime(40.0).request_id == "a"  # aged 30 s in P1: now P0


# ───────────────────────────── DRR ─────────────────────────────


def test_drr_serves_quanta_of_tokens_per_class_per_round():
    p = DRR(base_quantum=64)  # quanta P0 512, P1 256, P2 128, P3 64
    push_all(p, [req(f"a{i}", arrival_s=0.0, priority=1, prompt_len=112, max_tokens=16) for i in range(5)])  # cost 128
    push_all(p, [req(f"b{i}", arrival_s=0.0, priority=3, prompt_len=16, max_tokens=16) for i in range(3)])  # cost 32
    # round 1: P1 256 → a0 a1; P3 64 → b0 b1; round 2: a2 a3, b2; round 3: a4
    assert drain(p) == ["a0", "a1", "b0", "b1", "a2", "a3", "b2", "a4"]


def test_drr_skips_fruitless_rounds_at_once():
    p = DRR(base_quantum=1)
    p.push(req("huge", arrival_s=0.0, priority=3, prompt_len=99_984, max_tokens=16), 0.0)  # cost 100 000, quantum 1
    assert p.pop(0.0).request_id == "huge"
    assert p.deficit[3] == 0.0


# ───────────────────────────── bubble queues ─────────────────────────────


def length(rid: str, L: int, t: float = 0.0, cls: int = 1):
    return req(rid, arrival_s=t, priority=cls, prompt_len=L - 16, max_tokens=16)  # max_tokens is 16: L = prompt + 16


def spans(line: BubbleLine) -> list[tuple[float, float, int]]:
    return [(p.lo, p.hi, len(p)) for p in line.parts]


def pop_all(line: BubbleLine) -> list[str]:
    out = []
    while (r := line.pop()) is not None:
        out.append(r.request_id)
    return out


def test_a_short_partition_gives_several_per_turn_a_long_one_gives_one():
    b = BubbleLine()
    for i in range(5):
        b.push(length(f"s{i}", 100, float(i)), 1)
    for i in range(3):
        b.push(length(f"l{i}", 3000, float(i)), 1)
    # L̄_max = 3000: shorts round(3000 / 100) = 30, hot → 60 (all); longs 1
    assert pop_all(b) == ["s0", "s1", "s2", "s3", "s4", "l0", "l1", "l2"]
    f = BubbleLine(dynamic=False)
    for r in [length("s0", 100), length("s1", 100), length("l0", 3000), length("l1", 3000)]:
        f.push(r, 1)
    assert pop_all(f) == ["s0", "l0", "s1", "l1"]  # fixed: one each per round


def test_bubble_partitions_start_log_spaced_and_serve_shortest_first_in_turns():
    b = BubbleLine()
    for rid, L in [("s1", 100), ("s2", 200), ("m1", 1000), ("l1", 5000), ("x1", 20000), ("s3", 50)]:
        b.push(length(rid, L), 1)
    assert spans(b) == [(0, 512, 3), (512, 2048, 1), (2048, 8192, 1), (8192, float("inf"), 1)]
    assert [p.hot for p in b.parts] == [True, False, False, False]  # 3 / 1.5 > 1.10
    # the short partition's quantum, 2 (hot) · round(L̄_max 20000 / its 117), takes all
    # three; then one from each of the others
    assert pop_all(b) == ["s1", "s2", "s3", "m1", "l1", "x1"]
    assert spans(b)[0] == (0, 512, 0)  # all served: the base bounds are back


def test_a_length_in_a_gap_gets_a_bubble_of_at_most_the_gap():
    b = BubbleLine(bubble_width=256)
    b.push(length("a", 100), 1)
    b.push(length("b", 1000), 1)
    assert b.pop().request_id == "a"  # [0,512) empties and is dropped
    assert spans(b)[0] == (512, 2048, 1)
    b.push(length("c", 300), 1)  # in the gap [0, 512): a bubble 256 wide centred on 300
    assert spans(b)[0] == (172, 428, 1) and b.parts[0].bubble
    b.push(length("d", 480), 1)  # gap [428, 512) is narrower than 256: the bubble is the gap
    assert spans(b)[:3] == [(172, 428, 1), (428, 512, 1), (512, 2048, 1)]
    b.push(length("e", 10), 1)  # near the axis' start: shifted right to fit [0, 172)
    assert spans(b)[0] == (0, 172, 1)
    assert b.bubbles_made == 3


def test_adjacent_lightly_loaded_partitions_merge():
    b = BubbleLine(bubble_width=4096)
    for i in range(6):
        b.push(length(f"s{i}", 100, float(i)), 1)
    b.push(length("m", 1000), 1)
    assert b.merges == 0  # mean 3.5: the lone m is under half, but its neighbours are empty
    b.push(length("l", 3000), 1)
    # mean 8/3: m and l are each under 1.33, adjacent, non-empty → one partition
    assert spans(b) == [(0, 512, 6), (512, 8192, 2), (8192, float("inf"), 0)]
    assert b.merges == 1
    # shorts: 2 · round(575 / 100) = 12 a turn; in the merged one, equal deadlines go by id
    assert pop_all(b) == ["s0", "s1", "s2", "s3", "s4", "s5", "l", "m"]


def test_hot_hysteresis_between_110_and_90_percent():
    b = BubbleLine()
    hot = lambda: [p.hot for p in b.parts[:2]]  # noqa: E731
    b.push(length("s0", 100), 1)
    b.push(length("m0", 1000), 1)
    assert hot() == [False, False]  # loads 1.0 / 1.0
    b.push(length("s1", 100), 1)
    assert hot() == [True, False]  # 1.33 / 0.67
    b.push(length("m1", 1000), 1)
    assert hot() == [True, False]  # 1.0 / 1.0: inside the band, s stays hot
    b.remove("s1")
    assert hot() == [False, True]  # 0.67 / 1.33


def test_fixed_partitions_never_change():
    b = BubbleLine(dynamic=False)
    b.push(length("a", 100), 1)
    b.push(length("b", 1000), 1)
    assert pop_all(b) == ["a", "b"]
    b.push(length("c", 300), 1)
    assert spans(b) == [(0, 512, 1), (512, 2048, 0), (2048, 8192, 0), (8192, float("inf"), 0)]
    assert b.bubbles_made == b.merges == 0


def test_sjf_without_aging_starves_the_long_request():
    from tests.test_queue_policies import sustained

    p = make_policy("sjf", aging_s=None)
    assert sustained(p, length("victim", 20_000), load_class=1, steps=600) is None
    # bubble: the short partition's turn is worth the 20k request's work, twice while hot:
    # 2 · round(20000 / 48) = 834 pops of 48-token requests, then the long one's turn
    q = make_policy("bubble", aging_s=None)
    assert sustained(q, length("victim", 20_000), load_class=1, steps=1200) == 834


def test_a_short_flood_does_not_shrink_the_short_partitions_turn():
    """Turns share work: 40 short requests (L = 100) and 2 long ones (L = 10 000). The short
    partition's turn is 2 (hot) · 10000/100 requests, so all 40 go before the first long one.
    The earlier rule (work_turns=False: a turn worth the mean waiting length, 571 at first)
    gave the shorts 2 · round(5.7) = 12 a turn, growing as they leave and the mean rises: the
    first long request went after 18 shorts, 1,800 tokens against its 10,000, and under a short
    flood the shorts backed up behind the long ones."""
    shorts = [length(f"s{i:02d}", 100, float(i)) for i in range(40)]
    longs = [length(f"l{i}", 10_000, float(i)) for i in range(2)]
    b = BubbleLine()
    for r in shorts + longs:
        b.push(r, 1)
    assert pop_all(b) == [r.request_id for r in shorts + longs]
    old = BubbleLine(work_turns=False)
    for r in shorts + longs:
        old.push(r, 1)
    ids = [r.request_id for r in shorts]
    assert pop_all(old) == [*ids[:18], "l0", *ids[18:], "l1"]


lengths = st.lists(st.integers(1, 40_000), max_size=30)


@settings(max_examples=60, deadline=None)
@given(pushes=lengths, width=st.sampled_from([64.0, 700.0, 5000.0]), pops=st.lists(st.booleans(), max_size=60))
def test_bubble_partitions_stay_sorted_disjoint_and_hold_their_lengths(pushes, width, pops):
    b = BubbleLine(bubble_width=width)
    k = 0
    for i, L in enumerate(pushes):
        b.push(length(f"r{i:03d}", L + 16, float(i)), 1)
        if k < len(pops) and pops[k]:
            b.pop()
        k += 1
        for p, q in zip(b.parts, b.parts[1:], strict=False):
            assert p.lo < p.hi <= q.lo
        for part in b.parts:
            for r in part.line.requests():
                assert b.partition_of(r.request_id) is part
                assert part.lo <= r.prompt_len + r.max_tokens < part.hi
        assert len(b) == sum(len(p) for p in b.parts)  # and no request is kept twice or lost


# ───────────────────────────── keeps turn ─────────────────────────────


def test_put_back_requests_return_in_their_pop_order_before_anything_else():
    p = KeepsTurn(hybrid())
    push_all(p, [req("a", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("b", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("c", arrival_s=0.0, priority=2, prompt_len=32, max_tokens=16)])
    x, y = p.pop(0.0), p.pop(0.0)
    p.push(req("p0", arrival_s=0.0, priority=0, prompt_len=32, max_tokens=16), 0.0)
    p.push(y, 0.0)
    p.push(x, 0.0)
    assert drain(p, 0.0) == ["a", "b", "p0", "c"]


def test_a_put_back_request_can_be_aborted():
    p = KeepsTurn(hybrid())
    push_all(p, [req("a", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("b", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16)])
    a = p.pop(0.0)
    p.push(a, 0.0)
    assert "a" in p and len(p) == 2
    assert p.remove("a") is a
    assert "a" not in p and drain(p) == ["b"]


def test_pop_realtime_takes_a_put_back_p0_first_but_never_a_lower_class():
    p = KeepsTurn(hybrid())
    push_all(p, [req("a", arrival_s=0.0, priority=1, prompt_len=32, max_tokens=16), req("z", arrival_s=0.0, priority=0, prompt_len=32, max_tokens=16)])
    z, a = p.pop(0.0), p.pop(0.0)
    p.push(a, 0.0)
    assert p.pop_realtime(0.0) is None  # `a` (P1) waits in the lane, not from the P0 reserve
    p.push(z, 0.0)  # z was popped first: it heads the lane
    assert p.pop_realtime(0.0) is z
    assert p.pop_realtime(0.0) is None
    assert p.pop(0.0) is a
