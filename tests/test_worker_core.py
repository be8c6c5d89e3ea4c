"""WorkerCore: offer's verdicts, chunk numbering, the finished event's usage, heartbeats."""

from __future__ import annotations

import msgspec
import pytest
from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import EngineOutput, EngineStats
from tokenyard.shared.schemas import (
    REOFFERED,
    Accepted,
    Chunk,
    Finished,
    GenerateReply,
    Heartbeat,
    Outcome,
    Phase,
    Usage,
    WorkerControl,
)
from tokenyard.shared.slo import OfferPrefill
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req, stats


def core(max_waiting: int = 4, remember: int = 100) -> WorkerCore:
    return WorkerCore(
        WorkerConfig("w0", "m", engine="sim", max_waiting=max_waiting, remember=remember), ByteTokenizer()
    )


def test_offer_accepts_and_starts():
    c = core()
    assert c.offer(req(), stats()) == (GenerateReply("r1", True), True)
    assert list(c.streams) == ["r1"]


def test_a_second_offer_of_the_same_request_is_accepted_without_a_second_generation():
    c = core()
    c.offer(req(), stats())
    assert c.offer(req(), stats()) == (GenerateReply("r1", True, REOFFERED), False)
    # the same after it finished (a redelivery after a queue crash)
    c.on_output(EngineOutput("r1", [104], True, "length"))
    assert c.offer(req(), stats()) == (GenerateReply("r1", True, REOFFERED), False)
    # not the reused-id answer, whose client gets a 409 (a StrEnum equals its string)
    assert REOFFERED != Outcome.DUPLICATE


def test_offer_refuses_while_draining_or_unhealthy():
    c = core()
    c.on_control(WorkerControl("w0", drain=True))
    assert c.offer(req(), stats()) == (GenerateReply("r1", False, "draining"), False)
    c.on_control(WorkerControl("w0"))
    c.healthy = False
    assert c.offer(req(), stats()) == (GenerateReply("r1", False, "draining"), False)
    c.healthy = True
    # a refused request was not remembered: it may come back
    assert c.offer(req(), stats()) == (GenerateReply("r1", True), True)


def test_offer_refuses_another_model():
    assert core().offer(req(model="x"), stats()) == (GenerateReply("r1", False, "serves 'm', not 'x'"), False)


def test_offer_refuses_when_the_engine_queue_is_full():
    c = core(max_waiting=4)
    assert c.offer(req("a"), stats(waiting=3))[1] is True
    assert c.offer(req("b"), stats(waiting=4)) == (GenerateReply("b", False, "full"), False)
    assert c.offer(req("b"), stats(waiting=2))[1] is True


def test_an_abort_that_overtook_its_request_refuses_it():
    c = core()
    assert c.on_abort("r1") is False  # not running here
    reply, start = c.offer(req(), stats())
    assert (reply, start) == (GenerateReply("r1", False, "aborted"), False)
    assert reply.reason == Outcome.ABORTED
    assert c.streams == {}


def test_abort_of_a_running_request_is_reported_to_the_shell():
    c = core()
    c.offer(req(), stats())
    assert c.on_abort("r1") is True


def test_checks_run_in_order_aborted_duplicate_draining_model_full():
    c = core(max_waiting=1)
    c.on_control(WorkerControl("w0", drain=True))
    c.on_abort("x")
    assert c.offer(req("x", model="other"), stats(waiting=9))[0].reason == "aborted"
    c.on_control(WorkerControl("w0"))
    c.offer(req("d"), stats())
    c.on_control(WorkerControl("w0", drain=True))
    assert c.offer(req("d", model="other"), stats(waiting=9))[0].reason == REOFFERED
    assert c.offer(req("n", model="other"), stats(waiting=9))[0].reason == "draining"
    c.on_control(WorkerControl("w0"))
    assert c.offer(req("n", model="other"), stats(waiting=9))[0].reason == "serves 'm', not 'other'"
    assert c.offer(req("n"), stats(waiting=9))[0].reason == "full"


def test_remembered_ids_are_bounded():
    c = core(remember=2)
    for rid in ("a", "b", "c"):
        c.offer(req(rid), stats())
        c.on_output(EngineOutput(rid, [], True, "length"))
    assert c.offer(req("c"), stats()) == (GenerateReply("c", True, REOFFERED), False)  # remembered
    assert c.offer(req("a"), stats())[1] is True  # forgotten: generated again
    for rid in ("x", "y", "z"):
        c.on_abort(rid)
    assert c.offer(req("z"), stats())[0].reason == "aborted"  # remembered
    assert c.offer(req("x"), stats())[1] is True  # forgotten: an abort that came before it no longer counts


def test_outputs_become_numbered_chunks_then_finished_with_usage():
    c = core()
    c.offer(req(prompt_len=20, priority=2), stats())
    assert c.on_output(EngineOutput("r1", [104, 105], num_cached_tokens=16)) == [  # the first carries the acceptance
        Chunk("r1", 0, "hi", [104, 105], accepted=Accepted("r1", 2, 20), worker_id="w0")  # and names its worker
    ]
    assert c.on_output(EngineOutput("r1", [], num_cached_tokens=16)) == []  # nothing new, no chunk
    assert c.on_output(EngineOutput("r1", [33], num_cached_tokens=16)) == [Chunk("r1", 1, "!", [33])]
    assert c.on_output(EngineOutput("r1", [10], True, "length", num_cached_tokens=16)) == [
        Chunk("r1", 2, "\n", [10]),
        Finished("r1", 3, "length", Usage(20, 4, 24, 16), "w0"),
    ]
    assert c.streams == {}


def test_a_resumed_streams_first_chunk_here_names_this_worker_and_no_other_does():
    """A client whose stream goes silent probes the worker its latest named chunk gave
    (shared/stream_watch.py): a migrated or resumed stream's first chunk from here names it."""
    c = core()
    c.offer(msgspec.structs.replace(req(prompt_len=5), resume_token_ids=[97, 98, 99], resume_seq=3), stats())
    assert c.on_output(EngineOutput("r1", [100])) == [Chunk("r1", 3, "d", [100], worker_id="w0")]
    assert c.on_output(EngineOutput("r1", [101])) == [Chunk("r1", 4, "e", [101])]


def test_a_clients_resume_fences_the_old_generation_and_only_the_new_one_runs():
    """The client's resume (shared/resume.py) first aborts the old generation on its old inbox:
    a live router's re-issue of it that comes later is refused here, the resume (same id, a new
    inbox) is taken and numbers on from its seq, and a late abort of the old inbox spares it."""
    c = core()
    old, new = "_INBOX.0123456789abcdef.1aa", "_INBOX.0123456789abcdef.2bb"
    assert c.offer(req(reply_to=old, max_tokens=8), stats())[1] is True
    c.on_output(EngineOutput("r1", [97]))
    assert c.on_abort("r1", "client_resume", reply_to=old) is True  # running here: the engine stops it
    c.on_output(EngineOutput("r1", [], True, "abort"))
    reissue = msgspec.structs.replace(req(reply_to=old, max_tokens=8), resume_token_ids=[97], resume_seq=1,
                                      migrations=1)
    assert c.offer(reissue, stats()) == (GenerateReply("r1", False, "aborted"), False)
    resumed = msgspec.structs.replace(reissue, reply_to=new)
    assert c.offer(resumed, stats()) == (GenerateReply("r1", True), True)
    assert c.on_abort("r1", "client_resume", reply_to=old) is False  # the old one's abort again: spared
    assert c.on_output(EngineOutput("r1", [98])) == [Chunk("r1", 1, "b", [98], worker_id="w0")]


def test_an_aborted_stream_finishes_with_abort_and_the_tokens_so_far():
    c = core()
    c.offer(req(prompt_len=5), stats())
    c.on_output(EngineOutput("r1", [97]))
    assert c.on_output(EngineOutput("r1", [], True, "abort")) == [
        Finished("r1", 1, "abort", Usage(5, 1, 6, 0), "w0")
    ]


def test_a_finish_without_a_reason_is_stop():
    c = core()
    c.offer(req(prompt_len=3), stats())
    assert c.on_output(EngineOutput("r1", [], True)) == [Finished("r1", 0, "stop", Usage(3, 0, 3, 0), "w0")]


def test_control_sets_phase_macro_and_drain():
    c = core()
    c.on_control(WorkerControl("w0", "prefill", "m3", drain=False, epoch=7))
    assert (c.phase, c.macro_id, c.draining) == (Phase.PREFILL, "m3", False)


def test_heartbeat_carries_engine_stats_and_worker_state():
    c = core()
    s = EngineStats(2, 3, 40, 10, 90, 16, step_time_ms=12.5, prefix_hits=32, prefix_queries=64, preemptions=1)
    assert c.heartbeat(s, 100.0) == Heartbeat(
        worker_id="w0",
        model="m",
        seq=1,
        ts=100.0,
        stats=s,
        phase="mixed",
        healthy=True,
        engine="sim",
        draining=False,
        macro_id="",
    )
    c.on_control(WorkerControl("w0", "decode", "m1", drain=True))
    hb = c.heartbeat(s, 100.1)
    assert (hb.seq, hb.ts, hb.phase, hb.macro_id, hb.draining) == (2, 100.1, "decode", "m1", True)


def test_offer_refuses_while_the_prefill_backlog_exceeds_the_flow_control_horizon():
    c = core()
    # 0.1 ms per token: 2500 queued tokens are 0.25 s (= the horizon, still fine), 2600 are not
    ok, start = c.offer(req("a"), stats(queued=2500, prefill_ms_per_token=0.1))
    assert ok.accepted and start
    no, start = c.offer(req("b"), stats(queued=2600, prefill_ms_per_token=0.1))
    assert (no.accepted, no.reason, start) == (False, "saturated", False)
    # an engine that reports no prefill rate, or a worker with flow control off, takes it
    assert c.offer(req("c"), stats(queued=10**6))[0].accepted
    off = WorkerCore(WorkerConfig("w", "m", flow_control=False), ByteTokenizer())
    assert off.offer(req("d"), stats(queued=10**6, prefill_ms_per_token=0.1))[0].accepted


def test_offer_refuses_a_prefill_backlog_its_decodes_tpot_slack_cannot_absorb():
    c = core()
    # the tightest decode can absorb 50 ms more: 400 tokens at 0.1 ms (40 ms) fit, 600 do not
    assert c.offer(req("a"), stats(queued=400, prefill_ms_per_token=0.1, tpot_slack_ms=50.0))[0].accepted
    no, start = c.offer(req("b"), stats(queued=600, prefill_ms_per_token=0.1, tpot_slack_ms=50.0))
    assert (no.accepted, no.reason, start) == (False, "saturated", False)
    # a decode already past its slack: no prefill at all until it is done
    no, _ = c.offer(req("c"), stats(queued=1, prefill_ms_per_token=0.1, tpot_slack_ms=-1.0))
    assert no.reason == "saturated"
    # a P/D decode leg brings its KV, not a prefill: taken whatever the slack
    leg = msgspec.structs.replace(req("d"), kv_from="w-prefill")
    assert c.offer(leg, stats(prefill_ms_per_token=0.1, tpot_slack_ms=-1.0))[0].accepted


def test_offer_judges_a_request_by_the_prefill_it_would_wait_behind_in_the_engine():
    """In vLLM's priority order a P0 waits behind the running prefills and the waiting P0s, not
    the released P1/P2 work (EngineStats.queued_prefill_ahead): refusing it for that backlog
    only sent it back to the queue to retry (the live burst's P0 tail)."""
    c = core(max_waiting=16)
    # 0.1 ms per token; 4000 tokens (0.4 s) queued, of which 1000 ahead of a P0 and 3000 of a P1
    engine = stats(queued=4000, prefill_ms_per_token=0.1, queued_prefill_ahead=[1000, 3000, 4000, 4000])
    assert c.offer(req("p0", priority=0), engine)[0].accepted
    for rid, cls in (("p1", 1), ("p2", 2), ("p3", 3)):
        assert c.offer(req(rid, priority=cls), engine)[0].reason == "saturated"
    # 2600 ahead of a P0 (0.26 s): past the horizon, for a P0 too
    crowded = stats(queued=4000, prefill_ms_per_token=0.1, queued_prefill_ahead=[2600, 3000, 4000, 4000])
    assert c.offer(req("p0b", priority=0), crowded)[0].reason == "saturated"
    # the decodes absorb 0.3 s of prefill: the whole 0.4 s backlog is past it, whatever runs first
    tight = stats(queued=4000, prefill_ms_per_token=0.1, tpot_slack_ms=300.0, queued_prefill_ahead=[1000, 3000, 4000, 4000])
    assert c.offer(req("p0c", priority=0), tight)[0].reason == "saturated"
    # an engine that reports no split (a vLLM worker): every class judged by the whole backlog
    assert c.offer(req("p0d", priority=0), stats(queued=4000, prefill_ms_per_token=0.1))[0].reason == "saturated"
    assert c.offer(req("p0e", priority=0), stats(queued=2000, prefill_ms_per_token=0.1))[0].accepted


def test_the_live_x1_tails_holders_take_what_they_hold():
    """Round 10's live run (workers at speed 0.25: 0.298 ms a token of wall time, so the 0.25 s
    horizon is 838 tokens): every refusal was the ahead term, on a waiting conversation turn
    counted whole. The ahead term now reads the split net of cached prefixes, and is waived
    where r's first token comes here before its bare recompute could end elsewhere."""
    c = core(max_waiting=16)
    split = lambda gross, net: dict(queued=gross, prefill_ms_per_token=0.2984, tpot_slack_ms=2736.0,  # noqa: E731
                                    queued_prefill_ahead=[0, gross, gross, gross],
                                    queued_prefill_ahead_net=[0, net, net, net])
    # 1,706 tokens ahead (0.51 s), 154 of them to compute (a waiting turn's prefix cached): taken
    assert c.offer(req("a"), stats(**split(1706, 154)), OfferPrefill(441, 3561))[0].accepted
    assert c.offer(req("a0"), stats(**split(1706, 154)))[0].accepted  # without the counts too
    # 1,036 to compute ahead (0.31 s) + 379 of its own, against 2,603 recomputed elsewhere: taken
    assert c.offer(req("b"), stats(**split(1676, 1036)), OfferPrefill(379, 2603))[0].accepted
    assert c.offer(req("b0"), stats(**split(1676, 1036)))[0].reason == "saturated"  # no counts: refused
    # 1,899 ahead + 392 is later than 1,288 recomputed elsewhere: refused, as before
    assert c.offer(req("d"), stats(**split(2475, 1899)), OfferPrefill(392, 1288))[0].reason == "saturated"


def test_a_refusal_reports_the_terms_it_weighed():
    """The worker's `offer_refused` debug line: the gross and net prefill ahead of r's class,
    the whole backlog, the decodes' slack, the rate and the router's counts (round 10: which
    term refused live)."""
    engine = stats(queued=4000, waiting=3, prefill_ms_per_token=0.1, tpot_slack_ms=50.0,
                   queued_prefill_ahead=[1000, 3000, 4000, 4000], queued_prefill_ahead_net=[1000, 1200, 2200, 2200])
    assert WorkerCore.refusal_terms(engine, 1, OfferPrefill(441, 2873)) == dict(
        ahead=3000, ahead_net=1200, backlog=4000, slack_ms=50.0, ms_per_token=0.1, waiting=3, running=0,
        here=441, elsewhere=2873)
    # an engine without the split: the whole backlog for both; no counts: None
    terms = WorkerCore.refusal_terms(stats(queued=700), 0, None)
    assert (terms["ahead"], terms["ahead_net"], terms["here"], terms["elsewhere"]) == (700, 700, None, None)


def test_a_holder_past_its_decodes_slack_takes_a_request_that_would_recompute_more_anywhere_else():
    """Round 8's #220: its holder (3,120 of 3,561 tokens cached, 595 queued) refused it for its
    decodes' slack, and it recomputed 2,873 tokens elsewhere (254 ms, the run's worst). With
    the router's counts (shared.slo.OfferPrefill) the decode term refuses only when r's first
    token here, queue and all, comes no sooner than its bare recompute could end anywhere else."""
    c = core(max_waiting=16)
    # 0.1 ms per token; 595 queued (59.5 ms) past the decodes' 50 ms of slack
    engine = stats(queued=595, prefill_ms_per_token=0.1, tpot_slack_ms=50.0)
    assert c.offer(req("a"), engine)[0].reason == "saturated"  # no counts: as before
    assert c.offer(req("b"), engine, OfferPrefill(441, 2873))[0].accepted  # 595 + 441 < 2873
    assert c.offer(req("c"), engine, OfferPrefill(441, 1000))[0].reason == "saturated"  # 595 + 441 ≥ 1000
    # nothing cached anywhere: the same recompute everywhere, refused as before
    assert c.offer(req("d"), engine, OfferPrefill(3561, 3561))[0].reason == "saturated"
    # the wait ahead is weighed the same way (round 10): 2600 tokens (0.26 s) ahead is past the
    # horizon, but 2600 + 100 here is still sooner than 10**6 recomputed anywhere else
    crowded = stats(queued=2600, prefill_ms_per_token=0.1, tpot_slack_ms=50.0)
    assert c.offer(req("e"), crowded, OfferPrefill(100, 10**6))[0].accepted
    assert c.offer(req("e2"), crowded, OfferPrefill(100, 2700))[0].reason == "saturated"  # 2600 + 100 ≥ 2700
    # the header's form, and a malformed one ignored
    assert OfferPrefill.parse(OfferPrefill(441, 2873).header()) == (441, 2873)
    assert [OfferPrefill.parse(v) for v in (None, "", "1", "a,b", "-1,5", "1,2,3")] == [None] * 6


def test_an_ecoserve_prefill_phase_starved_of_work_is_not_saturated():
    """Its phase ends once ≤ 2 wait (shared.ecoserve.leaves_prefill); the quarter second of
    prefill flow control allows would keep it there on an engine whose chunk takes longer. Up
    to its minimum phase length (1 s) of prefill it takes more."""
    eco, pd = core(max_waiting=8), core(max_waiting=8)
    eco.on_control(WorkerControl("w0", "prefill", "m1", mode="ecoserve"))
    pd.on_control(WorkerControl("w0", "prefill", "m1", mode="pd"))
    assert eco.heartbeat(stats(), 1.0).mode == "ecoserve"
    backlog = {"queued": 9000, "prefill_ms_per_token": 0.1}  # 0.9 s of prefill
    assert eco.offer(req("a"), stats(waiting=2, **backlog))[0].accepted
    assert eco.offer(req("b"), stats(waiting=3, **backlog))[0].reason == "saturated"
    assert eco.offer(req("c"), stats(waiting=1, queued=10_000, prefill_ms_per_token=0.1))[0].reason == "saturated"
    assert pd.offer(req("d"), stats(waiting=0, **backlog))[0].reason == "saturated"  # P/D has no phase to end


def test_the_heartbeat_reports_the_share_of_max_tokens_the_finished_requests_ran():
    """Admission prices the decodes a backlog will run by it: a request that stops at EOS costs
    the engine what it ran, not its max_tokens."""
    c = core()
    assert c.heartbeat(stats(), 1.0).output_share == 0.0  # nothing finished: unknown
    c.offer(req("a", max_tokens=100), stats())
    c.on_output(EngineOutput("a", [104] * 25, True, "stop"))  # 25 of 100
    beat = c.heartbeat(stats(), 2.0)
    assert beat.output_share == 0.25
    c.offer(req("b", max_tokens=100), stats())
    c.on_output(EngineOutput("b", [104] * 100, True, "length"))  # then all 100: sums decayed by 31/32
    assert c.output_share() == pytest.approx((25 * 31 / 32 + 100) / (100 * 31 / 32 + 100))
    # a changed share is news: the simulator sends a heartbeat, not a keep-alive
    assert not c.repeats(beat, beat.stats)


def test_an_abort_for_one_reply_subject_stops_that_generation_alone():
    """A reused id's newcomer is stopped by an abort naming its reply subject: the first request
    of the id, running here or offered later, runs on; the newcomer, running or still on its
    way, is stopped; a later plain abort still stops any."""
    c = core()
    c.offer(req(reply_to="_INBOX.first"), stats())
    assert c.on_abort("r1", "duplicate_request_id", reply_to="_INBOX.newcomer") is False  # not the one here
    assert list(c.streams) == ["r1"] and not c.streams["r1"].silenced
    other = core()
    assert other.on_abort("r1", "duplicate_request_id", reply_to="_INBOX.newcomer") is False  # overtook its offer
    assert other.offer(req(reply_to="_INBOX.newcomer"), stats()) == (GenerateReply("r1", False, "aborted"), False)
    assert other.offer(req(reply_to="_INBOX.first"), stats()) == (GenerateReply("r1", True), True)  # the first: runs
    third = core()
    third.offer(req(reply_to="_INBOX.newcomer"), stats())
    assert third.on_abort("r1", "duplicate_request_id", reply_to="_INBOX.newcomer") is True
    third.streams.pop("r1")  # (its engine ended the stopped generation)
    # the first request, migrated here from a worker that died, is not a duplicate of the stopped one
    assert third.offer(req(reply_to="_INBOX.first", migrations=1), stats()) == (GenerateReply("r1", True), True)
    assert third.offer(req(reply_to="_INBOX.newcomer"), stats()) == (GenerateReply("r1", False, "aborted"), False)
    assert other.on_abort("r1") is True  # a plain abort: any generation of the id
    assert other.on_abort("r1", "x", reply_to="_INBOX.elsewhere") is False
    assert other.offer(req(reply_to="_INBOX.first"), stats())[1] is False  # still aborted for every subject


def test_a_migration_fence_stops_the_old_generation_not_the_reissue_it_fences_for():
    """The router fences a re-issue with an abort `migrated` before it offers the request again;
    abort and offer reach a worker on two subscriptions, so the worker taking the re-issue may
    see the fence after the offer. The fence names the migration it is for: a generation started
    before it (the worker thought dead) is silenced, the re-issue (migrations = that number) runs on."""
    from tokenyard.shared.schemas import MIGRATED

    old = core()
    old.offer(req(reply_to="_INBOX.c"), stats())  # migrations 0: the first placement
    assert old.on_abort("r1", MIGRATED, before_migration=1) is True and old.streams["r1"].silenced
    new = core()
    new.offer(req(reply_to="_INBOX.c", migrations=1), stats())  # the re-issue, taken before the fence came
    assert new.on_abort("r1", MIGRATED, before_migration=1) is False and not new.streams["r1"].silenced
    anyone = core()
    anyone.offer(req(reply_to="_INBOX.c", migrations=1), stats())
    assert anyone.on_abort("r1", MIGRATED) is True and anyone.streams["r1"].silenced  # an unnumbered fence: any
