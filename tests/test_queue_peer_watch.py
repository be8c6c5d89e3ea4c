"""Whether a queue replica leaves a stored copy to the replica that took it
(services/priority_queue/peer_watch.py): while the taker lives, judged by when it was last heard
(its state, or for a taker never heard, its first copy here), and never by a silence this replica
could not hear (its own outage)."""

from __future__ import annotations

from tokenyard.services.priority_queue.peer_watch import PEER_SILENT_S, PeerWatch, leave_to_taker


def test_a_copy_with_no_taker_or_taken_here_is_this_replicas_to_place():
    watch = PeerWatch("q1")
    assert not watch.leave_to_taker(None, None, 10.0)
    assert not watch.leave_to_taker("", None, 10.0)
    watch.on_state("q1", 9.9)  # its own state, heard back: not a peer
    assert not watch.leave_to_taker("q1", None, 10.0)
    assert watch.heard == {}


def test_a_taker_heard_lately_keeps_its_copy_and_one_silent_for_long_gives_it_up():
    watch = PeerWatch("q1")
    watch.on_state("q2", 10.0 - PEER_SILENT_S / 2)
    watch.on_state("q3", 10.0 - PEER_SILENT_S * 2)
    assert watch.leave_to_taker("q2", None, 10.0)
    assert not watch.leave_to_taker("q3", None, 10.0)


def test_a_taker_never_heard_keeps_its_copies_for_PEER_SILENT_S_after_the_first_came():
    """Chaos seed 12: a front restarted after the queue kill took a submit before its first state
    reached the standby, which had run for long. The old rule counted a never-heard taker silent
    since the standby's own start and placed the copy a second time."""
    watch = PeerWatch("standby")
    first = 100.0  # the standby has run for 100 s and never heard "restarted"
    assert watch.leave_to_taker("restarted", None, first)
    assert watch.leave_to_taker("restarted", None, first + PEER_SILENT_S / 2)  # its retry: still left
    # a taker that never speaks (it died before its first state) gives its copies up after that
    assert not watch.leave_to_taker("restarted", None, first + PEER_SILENT_S * 1.5)
    # once heard, its state decides
    watch.on_state("restarted", first + 2 * PEER_SILENT_S)
    assert watch.leave_to_taker("restarted", None, first + 2.5 * PEER_SILENT_S)


def test_a_replica_that_just_started_leaves_its_peers_first_copies():
    watch = PeerWatch("q1")  # heard no one yet
    assert watch.leave_to_taker("q2", None, 0.1)


def test_a_silence_that_spanned_this_replicas_own_outage_proves_nothing():
    """Chaos seed 11: the nats-server down 3 s; every peer was last heard before it. Back 0.3 s
    ago, this replica must not take its peers' copies for theirs being gone (they placed them)."""
    heard, back = 10.0 - 3.5, 10.0 - 0.3
    assert not leave_to_taker("q2", "q1", heard, None, 10.0)  # the old rule: gone, placed again
    assert leave_to_taker("q2", "q1", heard, back, 10.0)
    # once back for PEER_SILENT_S with the taker still unheard, it is gone after all
    assert not leave_to_taker("q2", "q1", heard, back, back + PEER_SILENT_S * 1.5)
