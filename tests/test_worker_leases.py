"""The worker follows its requests' leases (services/worker/leases.py, WorkerCore.lease_probes /
on_lease_answer), on a virtual clock: one probe per lease once it went unproven for
ORPHAN_AFTER_S, none for younger requests; "no responders" aborts that lease's requests here
(and refuses a redelivered copy); a timeout or an answer keeps them."""

from __future__ import annotations

from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.leases import ORPHAN_AFTER_S, LeaseProbe, LeaseWatch
from tokenyard.shared.schemas import GenerateReply, Outcome
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req, stats

A, B = "0123456789abcdef", "fedcba9876543210"


def core() -> WorkerCore:
    return WorkerCore(WorkerConfig("w0", "m", engine="sim"), ByteTokenizer())


def inbox(lease: str, n: int, user: str = "") -> str:
    return f"_INBOX.{user + '.' if user else ''}{lease}.{n}"


def test_a_lease_is_probed_once_it_went_unproven_for_orphan_after_s_never_before():
    w = LeaseWatch()
    running = {A: f"_INBOX.{A}.alive"}
    assert w.tick(100.0, running) == []  # first seen: its clock starts
    assert w.tick(100.0 + ORPHAN_AFTER_S - 0.1, running) == []
    assert w.tick(100.0 + ORPHAN_AFTER_S, running) == [LeaseProbe(A, f"_INBOX.{A}.alive", 103.0)]
    assert w.tick(104.5, running) == []  # one probe out at a time
    assert not w.on_answer(A, False, 103.0)  # timed out: alive-or-late as of 103
    assert w.tick(105.9, running) == []
    assert w.tick(106.0, running) == [LeaseProbe(A, f"_INBOX.{A}.alive", 106.0)]
    assert not w.on_answer(A, True, 106.0)  # no responders once: maybe a brief reconnect
    assert w.tick(108.9, running) == []
    assert w.tick(109.0, running) == [LeaseProbe(A, f"_INBOX.{A}.alive", 109.0)]
    assert w.on_answer(A, True, 109.0)  # no responders again, 3 s on: gone
    assert w.probes == 3


def test_a_single_no_responders_between_answers_is_a_reconnect_not_a_death():
    w = LeaseWatch()
    running = {A: "s"}
    w.tick(0.0, running)
    w.tick(3.0, running)
    assert not w.on_answer(A, True, 3.0)  # the client reconnecting
    w.tick(6.0, running)
    assert not w.on_answer(A, False, 6.0)  # back: the suspicion is dropped
    w.tick(9.0, running)
    assert not w.on_answer(A, True, 9.0)  # a second blip, later, starts afresh
    w.tick(12.0, running)
    assert w.on_answer(A, True, 12.0)


def test_a_lease_with_no_request_left_is_forgotten_and_starts_afresh():
    w = LeaseWatch()
    w.tick(0.0, {A: "s"})
    w.tick(2.0, {})
    assert w.proven == {}
    assert w.tick(4.0, {A: "s"}) == []  # seen anew at 4: not probed at 4 for being known at 0
    assert [p.sent_s for p in w.tick(7.0, {A: "s"})] == [7.0]


def test_after_a_reconnect_clocks_restart_and_an_earlier_probe_proves_nothing():
    w = LeaseWatch()
    w.tick(0.0, {A: "s"})
    [probe] = w.tick(3.0, {A: "s"})
    w.on_reconnected(3.5)
    assert not w.on_answer(A, True, probe.sent_s)  # sent before the reconnect: ignored
    assert w.tick(6.4, {A: "s"}) == []  # 3 s from the reconnect, not from the first sight
    assert len(w.tick(6.5, {A: "s"})) == 1


def test_the_core_probes_each_lease_once_however_many_requests_it_has_here():
    c = core()
    for i in range(3):
        c.offer(req(f"a{i}", reply_to=inbox(A, i)), stats())
    c.offer(req("b0", reply_to=inbox(B, 0, user="client")), stats())
    c.offer(req("plain", reply_to="_INBOX.Qx2b9r4TfEeWc1AaZzYyXx"), stats())  # no lease: never probed
    assert c.lease_probes(10.0) == []
    assert c.lease_probes(13.0) == [LeaseProbe(A, f"_INBOX.{A}.alive", 13.0),
                                    LeaseProbe(B, f"_INBOX.client.{B}.alive", 13.0)]


def test_no_responders_aborts_every_request_of_that_lease_here_and_no_other():
    c = core()
    for i in range(2):
        c.offer(req(f"a{i}", reply_to=inbox(A, i)), stats())
    c.offer(req("b0", reply_to=inbox(B, 0)), stats())
    c.lease_probes(0.0)
    c.lease_probes(3.0)
    assert c.on_lease_answer(B, False, 3.0) == []  # B timed out: alive-or-late, kept
    assert c.on_lease_answer(A, True, 3.0) == []  # once: maybe a brief reconnect
    assert [p.lease for p in c.lease_probes(6.0)] == [A, B]
    assert c.on_lease_answer(B, False, 6.0) == []
    assert c.on_lease_answer(A, True, 6.0) == ["a0", "a1"]  # twice, 3 s apart: gone
    # the engine's abort output ends the stream; a redelivered copy of it is refused
    c.on_output(EngineOutput("a0", [], True, "abort"))
    assert "a0" not in c.streams and "b0" in c.streams
    assert c.offer(req("a0", reply_to=inbox(A, 0)), stats()) == (GenerateReply("a0", False, Outcome.ABORTED), False)
    # B is followed on: probed again 3 s after it was last proven
    assert [p.lease for p in c.lease_probes(9.0)] == [B]


def test_a_migrated_away_request_is_not_followed_here():
    c = core()
    c.offer(req("a0", reply_to=inbox(A, 0)), stats())
    c.lease_probes(0.0)
    c.on_abort("a0", "migrated")
    assert c.lease_probes(5.0) == []
    assert c.leases.proven == {}
