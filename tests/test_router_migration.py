"""MigrationCore, pure: how a worker's death is found (heartbeat loss, no responders, stream
silence), what a re-issue carries (prompt, tokens sent, the next seq), the per-request limit,
migration off, orphans, and the invariant that the tokens a request resumes with are exactly
the chunks its client received, in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenyard.services.router.migration import (
    LEASES_REMEMBERED,
    Fail,
    MigrationConfig,
    MigrationCore,
    Orphaned,
    Probe,
    ProbeLease,
    Reissue,
    alive_subject,
    lease_of,
)
from tokenyard.shared import natsutil
from tokenyard.shared.schemas import AdmittedRequest, Chunk, Error, Finished, Usage

from tests import builders

CFG = MigrationConfig(suspect_after_s=0.5, dead_after_s=3.0, silence_s=10.0, probe_every_s=0.5,
                      reissue_deadline_s=10.0, orphan_after_s=3.0)


def req(rid: str = "r1", max_tokens: int = 8, reply_to: str = "_INBOX.1ea5e00000000001.x") -> AdmittedRequest:
    return builders.req(rid, tokens=[1, 2, 3], chain=[], max_tokens=max_tokens, reply_to=reply_to)


def chunk(rid: str, seq: int, *ids: int) -> Chunk:
    return Chunk(rid, seq, "", list(ids))


def placed(cfg: MigrationConfig = CFG, worker: str = "w0", **kw) -> MigrationCore:
    m = MigrationCore(cfg)
    m.on_heartbeat(worker, 0.0)
    m.track(req(**kw), worker, 0.0)
    return m


def test_a_live_worker_needs_nothing():
    m = placed()
    for t in (0.1, 0.2, 0.3):
        m.on_heartbeat("w0", t)
        assert m.tick(t) == []


def test_heartbeat_loss_probes_then_no_responders_reissues_with_the_tokens_sent():
    m = placed()
    m.on_event("r1", chunk("r1", 0, 10, 11), 0.1)
    m.on_event("r1", chunk("r1", 1, 12), 0.2)
    assert m.tick(0.4) == []
    assert m.tick(0.6) == [Probe("w0")]
    assert m.tick(0.7) == []  # one probe per probe_every_s
    m.on_no_responders("w0", 0.7)
    [effect] = m.tick(0.8)
    assert isinstance(effect, Reissue)
    assert (effect.req.resume_token_ids, effect.req.resume_seq, effect.req.migrations) == ([10, 11, 12], 2, 1)
    assert effect.req.prompt_token_ids == [1, 2, 3] and effect.old_worker == "w0"
    assert effect.exclude == frozenset({"w0"})
    assert m.tick(0.9) == []  # the re-issue is out; nothing twice
    m.track(effect.req, "w1", 1.0)
    m.on_event("r1", chunk("r1", 2, 13), 1.1)
    assert m.tracked["r1"].token_ids == [10, 11, 12, 13] and m.tracked["r1"].next_seq == 3
    m.on_event("r1", Finished("r1", 3, "length", Usage(3, 4, 7)), 1.2)
    assert m.tracked == {} and m.migrated == 1


def test_a_worker_that_answers_no_probe_is_dead_after_dead_after_s():
    m = placed()
    m.tick(0.6)
    m.on_probe("w0", None, 1.0)
    assert m.tracked["r1"].lost_s is None
    m.on_probe("w0", None, 3.0)
    assert isinstance(m.tick(3.0)[0], Reissue)


def test_heartbeat_silence_alone_declares_death_after_dead_after_s():
    m = placed()
    assert m.tick(2.9) == [Probe("w0")]
    assert isinstance(m.tick(3.0)[0], Reissue)


def test_stream_silence_on_a_live_worker_that_lost_the_request_reissues_it():
    m = placed()
    for t in range(1, 11):
        m.on_heartbeat("w0", float(t))
    assert m.tick(10.0) == [Probe("w0")]
    m.on_probe("w0", {"r1"}, 10.0)  # still runs it (waiting in the engine): nothing to do
    assert m.tick(10.1) == []
    m.on_heartbeat("w0", 20.0)
    assert m.tick(20.0) == [Probe("w0")]
    m.on_probe("w0", set(), 20.0)  # alive, but no longer has it
    [effect] = m.tick(20.1)
    assert isinstance(effect, Reissue) and effect.req.migrations == 1


def test_migration_off_ends_the_request_with_a_503_at_detection():
    m = placed(MigrationConfig(enabled=False))
    m.on_event("r1", chunk("r1", 0, 10), 0.1)
    m.on_no_responders("w0", 0.2)
    [effect] = m.tick(0.2)
    assert isinstance(effect, Fail) and isinstance(effect.event, Error)
    assert (effect.event.status, effect.event.seq) == (503, 1)
    assert "migration is off" in effect.event.message and m.tracked == {} and m.failed == 1


def test_the_migration_limit_ends_the_request_with_a_503():
    m = MigrationCore(MigrationConfig(max_migrations=2))
    r = req()
    for hop in range(3):
        m.track(r, f"w{hop}", float(hop))
        m.on_no_responders(f"w{hop}", float(hop))
        [effect] = m.tick(float(hop))
        if hop < 2:
            assert isinstance(effect, Reissue) and effect.req.migrations == hop + 1
            assert effect.exclude >= {f"w{i}" for i in range(hop + 1)}
            r = effect.req
        else:
            assert isinstance(effect, Fail) and effect.event.status == 503
            assert "moved 2 times" in effect.event.message


def test_a_request_complete_but_for_its_finished_event_is_finished_by_the_router():
    m = placed(max_tokens=2)
    m.on_event("r1", chunk("r1", 0, 10, 11), 0.1)
    m.on_no_responders("w0", 0.2)
    [effect] = m.tick(0.2)
    assert isinstance(effect, Fail) and effect.event == Finished("r1", 1, "length", Usage(3, 2, 5))


def test_a_reissue_no_worker_takes_is_retried_until_the_deadline():
    m = placed()
    m.on_no_responders("w0", 1.0)
    assert isinstance(m.tick(1.0)[0], Reissue)
    assert m.reissue_failed("r1", 2.0) is None  # retried on the next tick
    assert isinstance(m.tick(2.1)[0], Reissue)
    fail = m.reissue_failed("r1", 11.0)
    assert isinstance(fail, Fail) and fail.event.status == 503 and m.tracked == {}


def test_a_restarted_worker_is_alive_again_once_it_heartbeats():
    m = placed()
    m.on_no_responders("w0", 1.0)
    m.tick(1.0)
    assert m.workers["w0"].dead
    m.on_heartbeat("w0", 5.0)
    assert not m.workers["w0"].dead


def test_a_silent_lease_is_probed_and_its_requests_aborted_once_no_one_listens():
    m = MigrationCore(CFG)
    m.on_lease("1ea5e00000000001", 0.0)
    m.track(req("r1"), "w0", 0.0)
    m.track(req("r2", reply_to="_INBOX.abcdef"), "w0", 0.0)  # no lease: never judged
    for t in (1.0, 2.0):
        m.on_heartbeat("w0", t)
    assert m.tick(2.0) == []
    m.on_heartbeat("w0", 3.0)
    assert m.tick(3.0) == [ProbeLease("1ea5e00000000001", "_INBOX.1ea5e00000000001.alive")]
    assert m.tick(3.1) == []  # one probe per lease and probe_every_s
    assert not m.orphan(req("r3"), 3.1)
    m.on_lease_gone("1ea5e00000000001", 3.2)  # no responders: the client's connection is gone
    assert m.tick(3.2) == [Orphaned("r1")]
    assert list(m.tracked) == ["r2"]
    assert m.orphan(req("r3"), 3.2) and not m.orphan(req("r4", reply_to="_INBOX.x"), 3.2)


def test_a_late_lease_holder_that_is_still_connected_keeps_its_requests():
    """The overload probe's collapse: a CPU-starved edge published its lease 3.7 s late, and
    every request it held (308) was aborted as an orphan at once. A probe that is not refused
    (the holder is subscribed, only slow) orphans nothing; the lease coming back clears it."""
    m = MigrationCore(CFG)
    lease = "1ea5e00000000001"
    m.on_lease(lease, 0.0)
    m.track(req("r1"), "w0", 0.0)
    for t in (3.0, 3.5, 4.0):
        m.on_heartbeat("w0", t)
        assert all(isinstance(e, ProbeLease) for e in m.tick(t))
    m.on_lease(lease, 4.2)  # late, but here
    m.on_heartbeat("w0", 5.0)
    assert m.tick(5.0) == [] and list(m.tracked) == ["r1"]
    m.on_lease_gone(lease, 5.1)  # an answer to a probe sent before the lease came back
    assert m.tick(5.1) == [] and not m.orphan(req("r3"), 5.1)


def test_a_lease_silent_past_stalled_client_s_is_given_up_on_all_the_same():
    m = MigrationCore(CFG)
    m.on_lease("1ea5e00000000001", 0.0)
    m.track(req("r1"), "w0", 0.0)
    m.on_heartbeat("w0", CFG.stalled_client_s - 0.1)
    assert Orphaned("r1") not in m.tick(CFG.stalled_client_s - 0.1)
    m.on_heartbeat("w0", CFG.stalled_client_s)
    assert m.tick(CFG.stalled_client_s) == [Orphaned("r1")]


def test_a_flood_of_made_up_leases_is_bounded_and_a_live_client_keeps_its_own():
    """Anyone may publish on `llm.v1.lease.*`: the leases kept stop at LEASES_REMEMBERED, the
    least recently heard forgotten first. A client that keeps saying it is alive stays known
    (its orphans still found); a forgotten one's requests are never taken for orphans."""
    m = MigrationCore(CFG)
    live, quiet = "1ea5e00000000001", "1ea5e00000000002"
    m.on_lease(quiet, 0.0)
    m.on_lease(live, 0.0)
    m.track(req("r1"), "w0", 0.0)
    for i in range(LEASES_REMEMBERED + 10):
        m.on_lease(f"f{i:015x}", 0.5)
        if i == LEASES_REMEMBERED // 2:
            m.on_lease(live, 0.5)  # the client's own, every second, in the middle of the flood
    assert len(m.leases) == LEASES_REMEMBERED == m.remembered()["leases"][1]
    assert quiet not in m.leases and "f000000000000000" not in m.leases and live in m.leases
    m.on_lease_gone(live, 4.0)
    assert m.orphan(req("r2"), 4.0)  # still judged: its connection is gone
    assert not m.orphan(req("r3", reply_to=f"_INBOX.{quiet}.x"), 60.0)  # forgotten: runs on


def test_alive_subject_is_beside_the_leases_inboxes():
    assert alive_subject("_INBOX.client.0123456789abcdef.f00") == "_INBOX.client.0123456789abcdef.alive"


def test_after_the_routers_own_outage_nothing_is_declared_dead_or_orphaned():
    m = MigrationCore(CFG)
    m.on_lease("1ea5e00000000001", 0.0)
    m.on_heartbeat("w0", 0.0)
    m.track(req("r1"), "w0", 0.0)
    m.on_reconnected(6.0)  # deaf from 0 to 6 s
    assert m.tick(6.1) == []
    m.on_lease("1ea5e00000000001", 8.0)
    assert m.tick(8.9) == [Probe("w0")]
    assert isinstance(m.tick(6.0 + CFG.resubscribe_grace_s)[0], Reissue)  # silence after the outage still
    # counts, once a worker still reconnecting would be back


def test_no_responders_just_after_the_routers_own_reconnect_is_not_a_death():
    """bench chaos seed 17: the router came back from a bus outage first and probed w0, which
    had not resubscribed yet: "no responders" declared it dead, and its streams were re-issued
    while w0, back a moment later, ran them on. Within resubscribe_grace_s of the router's own
    reconnect a no-responders proves nothing; silence still decides."""
    m = placed()
    back = 6.0
    m.on_reconnected(back)  # deaf from 0 to 6 s
    assert m.tick(back + 0.6) == [Probe("w0")]  # not heard since the reconnect: probed
    m.on_no_responders("w0", back + 0.6, back_s=back)  # still reconnecting: no subscription yet
    assert m.tick(back + 0.7) == []
    m.on_heartbeat("w0", back + 0.8)  # back on the bus
    assert m.tick(back + 0.9) == [] and not m.workers["w0"].dead
    # once the grace has passed, no responders is proof again
    m.on_no_responders("w0", back + 6.5, back_s=back)
    assert isinstance(m.tick(back + 6.6)[0], Reissue)


def test_the_grace_after_a_reconnect_is_as_long_as_a_workers_own_reconnect_may_take():
    """A worker whose attempt hung on the silent address when the path healed is back up to
    natsutil.RECONNECT_BOUND_S after it (tests/test_worker_back_late.py: 5.3 s); until then
    neither its "no responders" nor its silence (past dead_after_s) is a death."""
    assert MigrationConfig().resubscribe_grace_s == natsutil.RECONNECT_BOUND_S == 6.25
    m = placed()
    m.on_reconnected(6.0)
    m.on_no_responders("w0", 6.0 + 3.1, back_s=6.0)  # past dead_after_s, an idle worker may still be on its way
    assert [e for e in m.tick(6.0 + 5.3) if not isinstance(e, Probe)] == []  # silent 5.3 s: still reconnecting
    m.on_no_responders("w0", 6.0 + 5.3, back_s=6.0)
    m.on_probe("w0", None, 6.0 + 5.4)  # a probe unanswered within the grace proves nothing either
    m.on_heartbeat("w0", 6.0 + 5.5)  # back
    assert not m.workers["w0"].dead and m.tick(6.0 + 5.6) == []


def test_a_worker_that_never_comes_back_after_the_routers_reconnect_is_dead_by_its_silence_after_the_grace():
    m = placed()
    m.on_reconnected(6.0)
    m.on_no_responders("w0", 6.6, back_s=6.0)
    assert m.tick(9.0) == [Probe("w0")]  # dead_after_s of silence, but within the grace: probed only
    assert isinstance(m.tick(6.0 + 6.25)[0], Reissue)  # silent through the grace: dead


def test_outside_a_reconnect_silence_kills_after_dead_after_s_as_before():
    m = placed()
    assert isinstance(m.tick(3.0)[0], Reissue)  # heard at 0, never reconnected: dead_after_s decides


def test_lease_of_reads_the_inbox():
    lease = "0123456789abcdef"
    assert lease_of(f"_INBOX.{lease}.def") == lease
    assert lease_of(f"_INBOX.client.{lease}.def") == lease  # a secured connection's inbox prefix
    assert lease_of("_INBOX.client.Qx2b9r4TfEeWc1AaZzYyXx") == ""  # a plain inbox, no lease
    assert lease_of("_INBOX.abcdef") == "" and lease_of("inbox.r1") == "" and lease_of("_INBOX.abc.def") == ""


def test_a_terminal_event_or_untrack_stops_following():
    m = placed()
    m.on_event("r1", Error("r1", 500, "engine failed"), 0.1)
    assert m.tracked == {}
    m = placed()
    m.untrack("r1")
    m.on_no_responders("w0", 1.0)
    assert m.tick(1.0) == []


@given(st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(0, 99), min_size=1, max_size=3)), max_size=30))
def test_resume_tokens_are_the_in_order_prefix_of_the_chunks_seen(arrivals):
    """Chunks arrive repeated and out of order; the re-issue resumes with exactly the tokens of
    seq 0, 1, … up to the first missing one, and resume_seq is that missing seq."""
    m = placed(max_tokens=10_000)
    payload: dict[int, list[int]] = {}
    for seq, ids in arrivals:
        ids = payload.setdefault(seq, ids)  # one seq always carries the same tokens
        m.on_event("r1", chunk("r1", seq, *ids), 0.1)
    m.on_no_responders("w0", 0.2)
    [effect] = m.tick(0.2)
    seen_first: dict[int, int] = {}
    for i, (seq, _) in enumerate(arrivals):
        seen_first.setdefault(seq, i)
    want_seq, want_tokens = 0, []
    # a seq counts only if it arrived after every smaller one had (the client does the same)
    order = [s for s, _ in arrivals]
    pos = 0
    while want_seq in seen_first:
        later = [i for i, s in enumerate(order) if s == want_seq and i >= pos]
        if not later:
            break
        pos = later[0]
        want_tokens += payload[want_seq]
        want_seq += 1
    assert effect.req.resume_seq == want_seq and effect.req.resume_token_ids == want_tokens


@given(st.lists(st.tuples(st.sampled_from(["lease", "gone", "tick"]), st.floats(0.0, 2.0)), max_size=40))
def test_a_request_is_orphaned_only_on_proof_or_past_stalled_client_s(events):
    """Whatever the order of leases, no-responders answers and ticks: a request is orphaned
    only when its client was proven gone after orphan_after_s of silence, or its lease was
    silent for stalled_client_s; and then it is, at the next tick."""
    m = MigrationCore(CFG)
    lease = "1ea5e00000000001"
    m.on_lease(lease, 0.0)
    m.track(req("r1"), "", 0.0)
    now, heard, proven = 0.0, 0.0, False
    for kind, dt in events:
        now += dt
        if kind == "lease":
            m.on_lease(lease, now)
            heard, proven = now, False
        elif kind == "gone":
            m.on_lease_gone(lease, now)
            proven = proven or now - heard >= CFG.orphan_after_s
        else:
            orphaned = Orphaned("r1") in m.tick(now)
            due = proven or now - heard >= CFG.stalled_client_s
            assert orphaned == due
            if due:
                assert "r1" not in m.tracked and m.orphan(req("r2"), now)
                return
