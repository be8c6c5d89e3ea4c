"""Whether a queue replica leaves a stored copy to the replica that took it
(services/priority_queue/peer_watch.py): while the taker lives, judged by when it was last heard,
and never by a silence this replica could not hear (its own start, its own outage)."""

from __future__ import annotations

from tokenyard.services.priority_queue.peer_watch import PEER_SILENT_S, leave_to_taker


def test_a_copy_with_no_taker_or_taken_here_is_this_replicas_to_place():
    assert not leave_to_taker(None, "q1", None, 0.0, None, 10.0)
    assert not leave_to_taker("", "q1", None, 0.0, None, 10.0)
    assert not leave_to_taker("q1", "q1", 9.9, 0.0, None, 10.0)


def test_a_taker_heard_lately_keeps_its_copy_and_one_silent_for_long_gives_it_up():
    assert leave_to_taker("q2", "q1", 10.0 - PEER_SILENT_S / 2, 0.0, None, 10.0)
    assert not leave_to_taker("q2", "q1", 10.0 - PEER_SILENT_S * 2, 0.0, None, 10.0)


def test_a_replica_that_just_started_has_heard_no_peer_yet_and_leaves_the_copy():
    assert leave_to_taker("q2", "q1", None, 10.0 - PEER_SILENT_S / 2, None, 10.0)
    assert not leave_to_taker("q2", "q1", None, 10.0 - PEER_SILENT_S * 2, None, 10.0)


def test_a_silence_that_spanned_this_replicas_own_outage_proves_nothing():
    """Chaos seed 11: the nats-server down 3 s; every peer was last heard before it. Back 0.3 s
    ago, this replica must not take its peers' copies for theirs being gone (they placed them)."""
    heard, back = 10.0 - 3.5, 10.0 - 0.3
    assert not leave_to_taker("q2", "q1", heard, 0.0, None, 10.0)  # the old rule: gone, placed again
    assert leave_to_taker("q2", "q1", heard, 0.0, back, 10.0)
    # once back for PEER_SILENT_S with the taker still unheard, it is gone after all
    assert not leave_to_taker("q2", "q1", heard, 0.0, back, back + PEER_SILENT_S * 1.5)
