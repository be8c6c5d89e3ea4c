"""bench.faults' overload probe reads where requests went from every service's `$SRV.STATS`.
Since the stats also carry the per-request state each service holds (`kept`, `remembered`:
bench.soak's, `remembered` as [count, bound] pairs), the probe died summing a list into a
count (TypeError) before its load began; the tally leaves those two out."""

from __future__ import annotations

from bench.faults.overload import tally


def test_the_tally_sums_counters_by_kind_and_label_and_leaves_held_state_out():
    replies = [
        {"name": "tokenyard-admission", "endpoints": [{"data": {
            "decisions": {"admitted": 5, "P2,rejected_rate": 2}, "running": 1,
            "kept": {"handing": 3}, "remembered": {"tenant_buckets": [4, None]}}}]},
        {"name": "tokenyard-admission", "endpoints": [{"data": None}, {"data": {"decisions": {"admitted": 2}}}]},
        {"name": "tokenyard-router", "endpoints": [{"data": {"remembered": {"ended": [7, 50_000]}}}]},
    ]
    assert tally(replies) == {"admission:decisions:admitted": 7, "admission:decisions:rejected_rate": 2,
                              "admission:running": 1}
