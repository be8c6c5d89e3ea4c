"""Adoption, pure (shared/adoption.py): a worker follows the router that placed each request it
runs (WorkerCore.router_probes / on_router_answer) and hands a gone router's requests over; the
adopting router's MigrationCore (expect / adopt) follows them from the worker's state, with the
events seen meanwhile replayed, and re-issues them with exactly the tokens sent if that worker
dies."""

from __future__ import annotations

from nats.errors import MaxPayloadError
from nats.errors import TimeoutError as NatsTimeoutError
from tokenyard.services.router.migration import MigrationConfig, MigrationCore, Reissue
from tokenyard.services.worker import handover
from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.leases import LeaseProbe
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.shared import codec, subjects
from tokenyard.shared.adoption import LIST_HEADER, AdoptAsk, AdoptReply, StreamState, ask_pieces, message_room
from tokenyard.shared.schemas import Chunk, Finished, Usage, WorkerControl
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders

A, B = "_INBOX.router.aaaa.alive", "_INBOX.router.bbbb.alive"
B_AT = subjects.router_adopted("router-b")
"""Where B answers which streams it adopted (its StateAsk names its id)."""


def req(rid: str = "r1", **kw):
    return builders.req(rid, tokens=[1, 2, 3], chain=[], max_tokens=8, reply_to=f"_INBOX.client.{rid}", **kw)


def worker() -> WorkerCore:
    return WorkerCore(WorkerConfig("w0", "m", engine="sim"), ByteTokenizer())


def place(w: WorkerCore, r, router: str) -> None:
    assert w.offer(r, builders.stats())[1]
    w.placed_by(r.request_id, router)


def test_the_worker_probes_each_placing_router_once_and_hands_a_gone_ones_requests_over():
    w = worker()
    place(w, req("r1"), A)
    place(w, req("r2"), A)
    place(w, req("r3"), B)
    w.offer(req("sim"), builders.stats())  # no router known (the simulator's offers): never handed over
    assert w.router_probes(0.0) == []
    assert w.router_probes(3.0) == [LeaseProbe(A, A, 3.0), LeaseProbe(B, B, 3.0)]
    assert w.on_router_answer(B, False, 3.0) == []  # B timed out: alive
    assert w.on_router_answer(A, True, 3.0) == []  # no responders once: maybe A reconnecting
    assert [p.lease for p in w.router_probes(6.0)] == [A, B]
    assert w.on_router_answer(B, False, 6.0) == []
    assert [r.request_id for r in w.on_router_answer(A, True, 6.0)] == ["r1", "r2"]  # twice: gone
    # until one adopts them they stay A's: A is seen anew and probed again 3 s on (a retry)
    assert w.router_probes(6.1) == []
    assert [p.lease for p in w.router_probes(9.2)] == [A, B]


def test_the_state_is_the_tokens_sent_with_the_resumed_ones_first_and_the_asker_is_followed():
    w = worker()
    place(w, req("r1", resume_token_ids=[7, 8], resume_seq=2, migrations=1), A)
    w.on_output(EngineOutput("r1", [104]))
    w.on_output(EngineOutput("r1", [105, 106]))
    assert handed_over(w, (0.0, 3.0, 6.0)) == ["r1"]
    [ask] = w.adopt_asks([w.streams["r1"].req], message_room(1 << 20))
    assert w.stream_states(["r1", "gone"], B, B_AT, ask.handover) == [StreamState("r1", [7, 8, 104, 105, 106], 4)]
    assert w.router_probes(6.1) == []
    assert [p.lease for p in w.router_probes(9.2)] == [A]  # B has not said it adopted r1 yet
    w.adoption_done(ask.handover, ["r1", "gone"], ["r1", "gone"])
    assert w.router_probes(12.3) == []  # B first seen here now: its clock starts
    assert [p.lease for p in w.router_probes(15.4)] == [B]  # now B is the one followed


def test_an_orphaned_request_is_not_handed_over():
    w = worker()
    place(w, req("r1"), A)
    w.on_abort("r1", "orphaned", req("r1").reply_to)
    w.router_probes(0.0)
    w.router_probes(3.0)
    assert w.on_router_answer(A, True, 3.0) == []
    w.router_probes(6.0)
    assert w.on_router_answer(A, True, 6.0) == []  # A gone, but r1 is no longer followed here
    assert w.stream_states(["r1"], B, B_AT, 1) == []


def test_the_adopting_router_replays_what_it_saw_meanwhile_and_reissues_with_the_tokens_sent():
    m = MigrationCore(MigrationConfig())
    m.on_heartbeat("w0", 0.0)
    m.expect("r1")
    # chunks heard between the subscription and the state: one the state has, one after it
    m.on_event("r1", Chunk("r1", 1, "", [105]), 0.1)
    m.on_event("r1", Chunk("r1", 2, "", [106]), 0.2)
    m.adopt(req("r1"), "w0", [104, 105], 2, 0.3)
    t = m.tracked["r1"]
    assert (t.token_ids, t.next_seq, t.worker_id, m.adopting) == ([104, 105, 106], 3, "w0", {})
    m.on_no_responders("w0", 0.5)
    [effect] = m.tick(0.6)
    assert isinstance(effect, Reissue)
    assert (effect.req.resume_token_ids, effect.req.resume_seq, effect.req.migrations) == ([104, 105, 106], 3, 1)


def test_a_stream_that_ended_while_its_state_was_asked_is_not_followed():
    m = MigrationCore(MigrationConfig())
    m.expect("r1")
    m.on_event("r1", Finished("r1", 1, "length", Usage(3, 1, 4)), 0.1)
    m.adopt(req("r1"), "w0", [104], 1, 0.2)
    assert m.tracked == {} and m.adopting == {}
    m.expect("r2")
    m.unexpect("r2")
    m.on_event("r2", Chunk("r2", 0, "", [1]), 0.3)
    assert m.adopting == {} and m.tracked == {}


def test_a_pd_decode_leg_is_not_handed_over():
    w = worker()
    w.on_control(WorkerControl("w0", mode="pd"))
    place(w, req("leg", kv_from="w9"), A)
    assert w.streams["leg"].placed_by == "" and w.router_probes(0.0) == [] and w.router_probes(5.0) == []


def long_req(rid: str, n: int = 600):
    """A request whose prompt and resumed tokens take ~3 bytes each in MessagePack."""
    return builders.req(rid, tokens=range(1000, 1000 + n), chain=[], max_tokens=4 * n, reply_to=f"_INBOX.client.{rid}",
                        resume_token_ids=list(range(2000, 2000 + n)), resume_seq=n, migrations=1)


def test_a_hand_over_goes_in_pieces_that_each_fit_the_room_with_their_states():
    w = worker()
    for i in range(40):
        place(w, long_req(f"r{i:02d}"), A)
    reqs = [w.streams[rid].req for rid in handed_over(w, (0.0, 3.0, 6.0))]
    assert len(reqs) == 40
    room = message_room(64 * 1024)  # 56 KiB
    assert room == 56 * 1024
    asks = w.adopt_asks(reqs, room)
    assert [r.request_id for a in asks for r in a.requests] == [r.request_id for r in reqs]  # all, in order
    whole = len(codec.encode(AdoptAsk("w0", reqs)))
    assert whole > 2 * room and len(asks) == 3  # one message would not fit; three do
    for a in asks:
        assert len(codec.encode(a)) <= room
        ids = [r.request_id for r in a.requests]
        assert 2 * len(codec.encode(w.stream_states(ids, B, B_AT, a.handover))) <= room + LIST_HEADER
    # a request too big for any piece goes alone
    big = long_req("big", 40_000)
    assert [len(a.requests) for a in ask_pieces("w0", [reqs[0], big, reqs[1]], [10, 10, 10], room)] == [1, 1, 1]


def test_the_state_answer_takes_only_the_states_that_fit_the_rest_stay_the_gone_routers():
    w = worker()
    for i in range(10):
        place(w, long_req(f"r{i}"), A)
    assert len(handed_over(w, (0.0, 3.0, 6.0))) == 10  # hand-over 1
    one = len(codec.encode(w.stream_states(["r0"], B, B_AT, 1)))
    states = w.stream_states([f"r{i}" for i in range(10)], B, B_AT, 1, room=3 * one + LIST_HEADER)
    assert [s.request_id for s in states] == ["r0", "r1", "r2"]
    assert [rid for rid, st in sorted(w.streams.items()) if st.adopting == B] == ["r0", "r1", "r2"]
    w.adoption_done(1, [f"r{i}" for i in range(10)], ["r0", "r1", "r2"])
    assert {rid: st.placed_by for rid, st in w.streams.items()} == {
        **{f"r{i}": B for i in range(3)}, **{f"r{i}": A for i in range(3, 10)}}


def handed_over(w: WorkerCore, times) -> list[str]:
    """Tick at `times`, A answering no responders to each probe: the ids handed over."""
    out = []
    for t in times:
        for p in w.router_probes(t):
            out += [r.request_id for r in w.on_router_answer(p.lease, p.lease == A, p.sent_s)]
    return out


def test_a_request_in_a_hand_over_is_not_handed_over_a_second_time_until_it_ends():
    w = worker()
    place(w, req("r1"), A)
    place(w, req("r2"), A)
    assert handed_over(w, (0.0, 3.0, 6.0)) == ["r1", "r2"]
    assert handed_over(w, (9.0, 12.0, 15.0, 18.0)) == []  # the first hand-over still out
    assert [st.request_id for st in w.stream_states(["r1"], B, B_AT, 1)] == ["r1"]
    w.adoption_done(1, ["r1", "r2"], ["r1"])  # B took r1 only; r2 is A's again, handed over later
    assert handed_over(w, (21.0, 24.0, 27.0)) == ["r2"]


class AdoptNc:
    """The worker's connection as its hand-over uses it: each AdoptAsk is answered by `answer(i, ids)`
    (the i-th ask), which raises or names what the router (B) adopted after asking the state."""

    max_payload = 1  # the room is then its floor, 1 KiB: one long request a piece

    def __init__(self, core: WorkerCore, fail):
        self.core, self.fail, self.asked = core, fail, []

    async def request(self, subject, data, timeout):
        ask = codec.decode(data, AdoptAsk)
        ids = [r.request_id for r in ask.requests]
        self.asked.append(ids)
        if (error := self.fail.get(len(self.asked))) is not None:
            raise error
        states = self.core.stream_states(ids, B, B_AT, ask.handover)
        return type("Msg", (), {"data": codec.encode(AdoptReply([s.request_id for s in states]))})()


async def probe_gone_router(shell: WorkerShell) -> None:
    """The shell's router probes at 0, 3 and 6 s, every one answered "no responders": the
    placing router proven gone at the second, and its streams handed over on `shell.nc`."""
    async def gone(subject):
        return True

    shell._gone = gone
    for t in (0.0, 3.0, 6.0):
        for p in shell.core.router_probes(t):
            await handover.probe_router(shell, p)


async def hand_over(fail) -> tuple[WorkerShell, AdoptNc]:
    shell = WorkerShell(WorkerConfig("w0", "m"), engine=None, tokenizer=ByteTokenizer())
    for rid in ("r1", "r2", "r3"):
        place(shell.core, long_req(rid, 300), A)
    shell.nc = AdoptNc(shell.core, fail)
    await probe_gone_router(shell)
    return shell, shell.nc


async def test_a_piece_that_cannot_go_is_skipped_a_router_that_does_not_answer_stops_the_hand_over():
    shell, nc = await hand_over({1: MaxPayloadError()})
    assert nc.asked == [["r1"], ["r2"], ["r3"]]  # one piece each; the first could not be sent
    assert {rid: st.placed_by for rid, st in shell.core.streams.items()} == {"r1": A, "r2": B, "r3": B}
    shell, nc = await hand_over({2: NatsTimeoutError()})
    assert nc.asked == [["r1"], ["r2"]]  # no router answered the second: the third waits too
    assert {rid: st.placed_by for rid, st in shell.core.streams.items()} == {"r1": B, "r2": A, "r3": A}
    assert not any(st.handing for st in shell.core.streams.values())  # all A's left are retried later
    assert handed_over(shell.core, (9.0, 12.0, 15.0)) == ["r2", "r3"]  # handed over again


def test_a_state_ask_for_a_hand_over_the_worker_gave_up_or_for_another_gets_nothing():
    """A late adopter (its ask queued behind others past the worker's wait) must not be told the
    state: it would follow the stream while the worker hands it to a third router, and both
    would re-issue it if the worker died."""
    C, C_AT = "_INBOX.router.cccc.alive", subjects.router_adopted("router-c")
    w = worker()
    place(w, req("r1"), A)
    w.on_output(EngineOutput("r1", [104]))
    assert handed_over(w, (0.0, 3.0, 6.0)) == ["r1"]
    [first] = w.adopt_asks([w.streams["r1"].req], message_room(1 << 20))
    w.adoption_lost(first.handover, ["r1"])  # no AdoptReply in time, no state told: the worker gave it up
    assert w.stream_states(["r1"], B, B_AT, first.handover) == []  # B's ask, come late
    assert handed_over(w, (9.0, 12.0, 15.0)) == ["r1"]
    [second] = w.adopt_asks([w.streams["r1"].req], message_room(1 << 20))
    assert second.handover != first.handover
    assert w.stream_states(["r1"], B, B_AT, first.handover) == []  # still late, during C's hand-over
    assert w.stream_states(["r1"], C, C_AT, second.handover) == [StreamState("r1", [104], 1)]
    w.adoption_done(second.handover, ["r1"], ["r1"])
    assert w.streams["r1"].placed_by == C
    assert w.stream_states(["r1"], C, C_AT, 0) == []  # and none outside a hand-over
