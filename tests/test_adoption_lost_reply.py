"""A hand-over whose AdoptReply is lost, pure (WorkerCore.adoption_lost / adopter_asks /
on_adopter_answer): the router told the state may follow the streams, so the worker asks that
router which it follows and credits exactly those to it; only the rest, or all of them once that
router is proven gone ("no responders" twice, ORPHAN_AFTER_S apart), are handed over again.
Handing them over at once, as before, let a second router follow the same streams: both would
re-issue them if the worker died (two generations on one client stream)."""

from __future__ import annotations

from nats.errors import TimeoutError as NatsTimeoutError
from tokenyard.services.worker import handover
from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.handover_core import AdopterAsk
from tokenyard.services.worker.leases import ORPHAN_AFTER_S, LeaseProbe
from tokenyard.services.worker.shell import WorkerShell
from tokenyard.shared import codec, subjects
from tokenyard.shared.adoption import (
    AdoptAsk,
    AdoptedAsk,
    AdoptReply,
    StateAsk,
    StreamState,
    adopted_ask,
    message_room,
)
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.test_adoption import B_AT, A, B, handed_over, place, probe_gone_router, req, worker

C, C_AT = "_INBOX.router.cccc.alive", subjects.router_adopted("router-c")
ROOM = message_room(1 << 20)


def lost_to_b(rids=("r1", "r2", "r3"), told=("r1", "r2")) -> tuple[WorkerCore, int]:
    """A's streams `rids` handed over at t = 6 (A gone), B told the state of `told`, and the
    AdoptReply lost: (the worker, the hand-over's serial)."""
    w = worker()
    for rid in rids:
        place(w, req(rid), A)
        w.on_output(EngineOutput(rid, [104]))
    assert handed_over(w, (0.0, 3.0, 6.0)) == list(rids)
    [ask] = w.adopt_asks([w.streams[rid].req for rid in rids], ROOM)
    assert [s.request_id for s in w.stream_states(list(told), B, B_AT, ask.handover)] == list(told)
    w.adoption_lost(ask.handover, rids)
    return w, ask.handover


def placed(w: WorkerCore) -> dict[str, str]:
    return {rid: st.placed_by for rid, st in sorted(w.streams.items())}


def test_a_lost_reply_asks_the_adopter_and_credits_exactly_the_streams_it_follows():
    w, _ = lost_to_b()
    assert placed(w) == {"r1": A, "r2": A, "r3": A}  # nothing credited on a missing reply
    [ask] = w.adopter_asks(6.1, ROOM)  # at once, on the subject B's StateAsk named
    assert ask == AdopterAsk(LeaseProbe(B, B_AT, 6.1), AdoptedAsk("w0", ["r1", "r2"]))
    assert w.adopter_asks(6.2, ROOM) == []  # one ask out per adopter
    # while B has not answered, r1 and r2 are never handed over again; r3 (no state told) is
    assert handed_over(w, (9.0, 12.0, 15.0)) == ["r3"]
    assert handed_over(w, (18.0, 21.0, 24.0)) == []
    w.on_adopter_answer(ask, ["r1", "r9"], gone=False)  # B follows r1 (r9: not asked, ignored)
    assert placed(w)["r1"] == B and placed(w)["r2"] == A
    assert w.adopter_asks(30.0, ROOM) == []  # nothing left unconfirmed
    # r2, which B does not follow, goes to a later hand-over; r1 is B's, probed as B's
    assert handed_over(w, (30.0, 33.0, 36.0)) == ["r2"]
    assert {p.lease for p in w.router_probes(40.0)} == {B}


def test_an_adopter_gone_twice_has_its_streams_handed_over_again_a_timeout_or_one_no_responders_does_not():
    w, _ = lost_to_b(("r1",), ("r1",))
    [ask] = w.adopter_asks(7.0, ROOM)
    w.on_adopter_answer(ask, None, gone=False)  # a timeout: maybe slow, asked again ORPHAN_AFTER_S on
    assert w.adopter_asks(7.0 + ORPHAN_AFTER_S - 0.1, ROOM) == []
    [ask] = w.adopter_asks(7.0 + ORPHAN_AFTER_S, ROOM)
    w.on_adopter_answer(ask, None, gone=True)  # no responders once: maybe B reconnecting
    assert w.streams["r1"].unconfirmed and handed_over(w, (11.0, 14.0)) == []
    [ask] = w.adopter_asks(10.0 + ORPHAN_AFTER_S, ROOM)
    w.on_adopter_answer(ask, None, gone=True)  # twice, that far apart: B is gone
    assert not w.streams["r1"].unconfirmed and placed(w) == {"r1": A}
    assert handed_over(w, (14.0, 17.0, 20.0)) == ["r1"]  # handed over again, to whoever takes it
    [again] = w.adopt_asks([w.streams["r1"].req], ROOM)
    assert w.stream_states(["r1"], C, C_AT, again.handover) == [StreamState("r1", [104], 1)]


def test_a_reconnect_of_the_worker_voids_a_no_responders_sent_before_it():
    w, _ = lost_to_b(("r1",), ("r1",))
    [ask] = w.adopter_asks(7.0, ROOM)
    w.on_adopter_answer(ask, None, gone=True)
    w.adopters.on_reconnected(9.0)
    [ask] = w.adopter_asks(9.0 + ORPHAN_AFTER_S, ROOM)
    w.on_adopter_answer(ask, None, gone=True)  # the first suspicion went with the reconnect
    assert w.streams["r1"].unconfirmed
    [ask] = w.adopter_asks(12.0 + ORPHAN_AFTER_S, ROOM)
    w.on_adopter_answer(ask, ["r1"], gone=False)  # and B answers after all
    assert placed(w) == {"r1": B} and not w.streams["r1"].unconfirmed


def test_a_reply_that_comes_credits_at_once_and_a_state_is_told_to_one_router_per_hand_over():
    w = worker()
    place(w, req("r1"), A)
    assert handed_over(w, (0.0, 3.0, 6.0)) == ["r1"]
    assert w.stream_states(["r1"], B, B_AT, 1) == [StreamState("r1", [], 0)]
    assert w.stream_states(["r1"], C, C_AT, 1) == []  # told to B in this hand-over: not to C too
    assert w.stream_states(["r1"], B, "", 1) == []  # a router that cannot be asked later: nothing
    w.adoption_done(1, ["r1"], ["r1"])
    assert placed(w) == {"r1": B} and w.adopter_asks(7.0, ROOM) == []


def test_an_ask_to_the_adopter_takes_the_ids_that_fit_the_rest_wait_for_the_next():
    rids = [f"req-{i:04d}-{'x' * 40}" for i in range(100)]
    w, _ = lost_to_b(rids, rids)
    room = 2048
    [ask] = w.adopter_asks(7.0, room)
    n = len(ask.ask.request_ids)
    assert 0 < n < 100 and len(codec.encode(ask.ask)) <= room
    assert ask.ask == adopted_ask("w0", rids, room) and ask.ask.request_ids == rids[:n]
    w.on_adopter_answer(ask, ask.ask.request_ids, gone=False)
    [nxt] = w.adopter_asks(7.0 + ORPHAN_AFTER_S, room)  # the rest, asked on B's next turn
    assert nxt.ask.request_ids[0] == rids[n]
    assert [rid for rid, by in placed(w).items() if by == B] == sorted(rids[:n])


class LosingNc:
    """The worker's connection to router B, which adopts what it is handed (asks the state) but
    whose AdoptReply is lost (a timeout), and which, asked again, names `follows`."""

    max_payload = 1 << 20

    def __init__(self, core: WorkerCore, follows: list[str]):
        self.core, self.follows, self.asked = core, follows, []

    async def request(self, subject, data, timeout):
        self.asked.append(subject)
        if subject == subjects.ADOPT:
            ask = codec.decode(data, AdoptAsk)
            self.core.stream_states([r.request_id for r in ask.requests], B, B_AT, ask.handover)
            raise NatsTimeoutError()
        assert subject == B_AT
        assert codec.decode(data, AdoptedAsk).worker_id == "w0"
        return type("Msg", (), {"data": codec.encode(AdoptReply(self.follows))})()


async def test_the_shell_asks_the_adopter_whose_reply_timed_out_on_the_subject_its_state_ask_named():
    shell = WorkerShell(WorkerConfig("w0", "m"), engine=None, tokenizer=ByteTokenizer())
    for rid in ("r1", "r2"):
        place(shell.core, req(rid), A)
    shell.nc = LosingNc(shell.core, ["r2"])
    await probe_gone_router(shell)
    assert shell.nc.asked == [subjects.ADOPT] and placed(shell.core) == {"r1": A, "r2": A}
    [ask] = shell.core.adopter_asks(6.1, message_room(shell.nc.max_payload))
    await handover.ask_adopter(shell, ask)
    assert shell.nc.asked == [subjects.ADOPT, B_AT]
    assert placed(shell.core) == {"r1": A, "r2": B}  # B's word; r1 waits for a later hand-over
    assert handed_over(shell.core, (9.0, 12.0, 15.0)) == ["r1"]


class StateRequest:
    """A StateAsk as nats.micro hands it to the worker: the asker's inbox on its message."""

    def __init__(self, ask: StateAsk, inbox: str = "_INBOX.router.bbbb.7"):
        self.data, self._msg, self.answers = codec.encode(ask), type("M", (), {"reply": inbox})(), []

    async def respond(self, data: bytes):
        self.answers.append(codec.decode(data, list[StreamState]))


async def test_a_state_ask_that_names_no_router_id_to_ask_later_is_told_nothing():
    shell = WorkerShell(WorkerConfig("w0", "m"), engine=None, tokenizer=ByteTokenizer())
    shell.nc = LosingNc(shell.core, [])
    place(shell.core, req("r1"), A)
    assert handed_over(shell.core, (0.0, 3.0, 6.0)) == ["r1"]
    for bad in ("", "router.b", "router-*", "x" * 65):
        asked = StateRequest(StateAsk(["r1"], 1, bad))
        await handover.on_state(shell, asked)
        assert asked.answers == [[]], bad
    assert shell.core.streams["r1"].adopting == ""  # nothing told, nobody to ask
    asked = StateRequest(StateAsk(["r1"], 1, "router-b"))
    await handover.on_state(shell, asked)
    assert asked.answers == [[StreamState("r1", [], 0)]]
    assert (shell.core.streams["r1"].adopting, shell.core.streams["r1"].adopter_at) == (B, B_AT)
