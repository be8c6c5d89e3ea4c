"""bench.accepted_wait's arithmetic: what a client that waits for `accepted` holds the first chunk for."""

from __future__ import annotations

from bench.accepted_wait import summary


def test_the_hold_is_how_much_later_accepted_came_and_zero_when_it_came_first():
    rows = [(1.0, 3.0, True), (5.0, 2.0, True), (4.0, 3.5, False), (2.0, 2.0, True)]
    s = summary(rows)
    assert s["first_chunk_before_accepted"] == 2  # the 2nd and 3rd
    assert s["held_waiting_for_accepted_ms"]["mean"] == (0 + 3.0 + 0.5 + 0) / 4
    assert s["held_waiting_for_accepted_ms"]["p50"] == 0.25  # median of 0, 0, 0.5, 3
    assert s["first_chunk_carries_acceptance"] == 3
    assert s["ttft_p50_ms"] == {"client_waits_for_accepted": 3.5, "first_chunk_as_it_arrives": 2.5}
