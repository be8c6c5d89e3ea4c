"""bench/route_why.py: why a live request left the worker holding most of its prefix, from the
router's choice lines, replayed through the default's bound and exemption."""

from __future__ import annotations

from bench.route_why import reason, reasons


def _line(rid, worker, plen, hit, load, queued):
    return {"request_id": rid, "worker": worker, "prompt_tokens": plen, "workers": ["w0", "w1", "w2", "w3"],
            "hit": list(hit), "load": list(load), "queued": list(queued), "notes": []}


def test_a_request_on_its_best_holder_gave_nothing_up():
    assert reason([_line("a", "w1", 1000, (0, 800, 0, 0), (5, 6, 5, 5), (0, 200, 0, 0))]) is None


def test_a_refusal_by_the_holder_is_named_first():
    offers = [_line("a", "w1", 1000, (0, 800, 0, 0), (5, 6, 5, 5), (0, 200, 0, 0)),
              _line("a", "w0", 1000, (0, 800, 0, 0), (6, 5, 5, 5), (1000, 0, 0, 0))]
    assert reason(offers) == (800, "refused")


def test_a_holder_beyond_the_bound_with_a_queue_longer_than_its_hit_is_not_exempt():
    # loads before r: 4 4 4 12 → cap ⌈1.25 · 25 / 4⌉ = 8: w3 beyond; it queues 900 ≥ its 800 cached
    line = _line("a", "w0", 1000, (0, 0, 0, 800), (5, 4, 4, 12), (1000, 0, 0, 900))
    assert reason([line]) == (800, "queue >= hit")


def test_beyond_the_bound_with_more_cached_than_queued_but_dearer_than_within_it():
    # w3: Q 700 < hit 800, but r's first token there comes after 700 + 200 = 900 tokens, on w0
    # (its own 300 taken back) after 0 + 300
    line = _line("a", "w0", 1000, (700, 0, 0, 800), (5, 4, 4, 12), (300, 0, 0, 700))
    assert reason([line]) == (100, "sooner elsewhere")
    within = _line("b", "w0", 1000, (0, 600, 0, 0), (5, 4, 4, 4), (1000, 0, 0, 0))  # w1 within the bound
    assert reason([within]) == (600, "within the bound")
    assert reasons([line, within]) == {"sooner elsewhere": (1, 100), "within the bound": (1, 600)}
