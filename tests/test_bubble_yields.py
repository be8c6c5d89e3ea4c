"""Bubble queues: a longer length range yields its turn to shorter ones until its head is
overdue (services/priority_queue/policies/bubble.py, round 9 in docs/results-bubble.md)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.priority_queue.policies.base import deadline
from tokenyard.services.priority_queue.policies.bubble import OVERDUE, BubbleLine
from tokenyard.services.priority_queue.policies.registry import make_policy

from tests.builders import req


def length(rid: str, L: int, t: float = 0.0, cls: int = 1, **fields):
    return req(rid, arrival_s=t, priority=cls, prompt_len=L - 16, max_tokens=16, **fields)


def pop_all(line: BubbleLine, now: float) -> list[str]:
    out = []
    line.at(now)
    while (r := line.pop()) is not None:
        out.append(r.request_id)
    return out


# Six 5,000-token requests in [2k, 8k) and one 10,000-token one in [8k, ∞), all arrived at 0,
# P1 (no admission stamp: deadline = arrival + 5 s, so the long head is overdue at 10 s).
# Round 5's turns: [2k, 8k) is hot (6 of 7 waiting) → 2 · round(10000 / 5000) = 4 a turn.
ROUND_ROBIN = ["m0", "m1", "m2", "m3", "x0", "m4", "m5"]


def fill(line: BubbleLine) -> BubbleLine:
    for i in range(6):
        line.push(length(f"m{i}", 5000), 1)
    line.push(length("x0", 10_000), 1)
    return line


def test_a_longer_range_waits_for_the_shorter_one_until_its_head_is_overdue():
    assert pop_all(fill(BubbleLine()), now=9.99) == ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]
    assert pop_all(fill(BubbleLine()), now=10.0) == ROUND_ROBIN  # overdue: its turn as before
    assert pop_all(fill(BubbleLine(yields=False)), now=1.0) == ROUND_ROBIN  # round 5's rule
    assert pop_all(fill(BubbleLine()), now=float("inf")) == ROUND_ROBIN  # never told the time
    assert pop_all(fill(BubbleLine(dynamic=False)), now=1.0) == [  # fixed: one each a round
        "m0", "x0", "m1", "m2", "m3", "m4", "m5"]


def test_the_shortest_waiting_range_never_yields():
    b = BubbleLine()
    b.push(length("x0", 10_000), 1)
    b.push(length("x1", 20_000), 1)
    assert pop_all(b, now=0.0) == ["x0", "x1"]


def test_overdue_is_twice_the_heads_own_ttft_span():
    assert OVERDUE == 2.0
    # admission stamped 5 s + 2 s of its own prefill: overdue at 2 · 7 = 14 s after arrival
    stamped = lambda: [length(f"m{i}", 5000, 3.0) for i in range(6)] + [  # noqa: E731
        length("x0", 10_000, 3.0, deadline_s=3.0 + 7.0, prefill_s=2.0)]
    for now, want in [(16.99, ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]), (17.0, ROUND_ROBIN)]:
        b = BubbleLine()
        for r in stamped():
            b.push(r, 1)
        assert pop_all(b, now) == want
    # P3 has no target: twice the loosest finite one (P2's 60 s), 120 s
    for now, want in [(119.9, ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]), (120.0, ROUND_ROBIN)]:
        b = BubbleLine()
        for i in range(6):
            b.push(length(f"m{i}", 5000, cls=3), 3)
        b.push(length("x0", 10_000, cls=3), 3)
        assert pop_all(b, now) == want


def test_the_policy_tells_its_lines_the_time_and_the_placement_keeps_round_5s_turns():
    for name, now, want in [("bubble", 9.0, ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]),
                            ("bubble", 10.0, ROUND_ROBIN), ("bubble-placed", 1.0, ROUND_ROBIN)]:
        p = make_policy(name, aging_s=None)
        for i in range(6):
            p.push(length(f"m{i}", 5000), 0.0)
        p.push(length("x0", 10_000), 0.0)
        assert [p.pop(now).request_id for _ in range(7)] == want, name


def test_a_flood_delays_the_long_head_only_until_it_is_overdue():
    """Every 0.1 s two 500-token requests arrive and one leaves; a 20k-token request waits
    from 0 (overdue at 10 s = pop 100). The short range's turn is 2 (hot) · round(20000 / 500)
    = 80 requests. Round 5's rule serves the victim at the end of the first turn, pop 80 (8 s);
    now it yields then (not yet overdue), the shorts take a second turn, and the victim leaves
    at its end, pop 160: the first round boundary after it became overdue."""
    from functools import partial

    from tokenyard.services.priority_queue.policies.hybrid import hybrid
    from tokenyard.services.priority_queue.policies.keeps_turn import KeepsTurn

    from tests.test_queue_policies import sustained

    victim = length("victim", 20_000)
    assert sustained(make_policy("bubble", aging_s=None), victim, load_class=1, load_len=484) == 160
    round5 = KeepsTurn(hybrid(None, partial(BubbleLine, yields=False)))
    assert sustained(round5, victim, load_class=1, load_len=484) == 80


times = st.lists(st.tuples(st.integers(1, 40_000), st.floats(0, 30), st.integers(1, 3)), max_size=25)


@settings(max_examples=80, deadline=None)
@given(pushes=times, clock=st.lists(st.floats(0, 60), min_size=1, max_size=40))
def test_only_the_shortest_range_or_an_overdue_head_leaves(pushes, clock):
    b = BubbleLine()
    for i, (L, t, cls) in enumerate(pushes):
        b.push(length(f"r{i:03d}", L + 16, t, cls), cls)
    left = set()
    for now in sorted(clock):
        b.at(now)
        shortest = next((p for p in b.parts if len(p)), None)
        r = b.pop()
        if r is None:
            break
        left.add(r.request_id)
        if not (shortest.lo <= r.prompt_len + r.max_tokens < shortest.hi):
            cls = r.priority
            span = deadline(r, cls) - r.arrival_s
            span = 60.0 if span == float("inf") else span
            assert now - r.arrival_s >= OVERDUE * span
    assert len(left) + len(b) == len(pushes)


def test_the_bench_sweeps_the_overdue_constant_by_policy_name():
    import pytest

    from bench.bubble import main, make_variant

    knobs = {"aging_s": None, "bubble_width": 1024.0}
    for name, want in [("bubble", ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]), ("bubble-o1", ROUND_ROBIN),
                       ("bubble-oinf", ["m0", "m1", "m2", "m3", "m4", "m5", "x0"]), ("bubble-r5", ROUND_ROBIN)]:
        p = make_variant(name, **knobs)
        for i in range(6):
            p.push(length(f"m{i}", 5000), 0.0)
        p.push(length("x0", 10_000), 0.0)
        assert [p.pop(5.0).request_id for _ in range(7)] == want, name  # o1: overdue at 5 s
    with pytest.raises(SystemExit):
        main(["--policies", "bubble-ox", "--floods", "0"])
