"""The adopting router's side (services/router/adopt.py) with a stand-in for its shell: on any
failure partway (the k-th follow, the state ask) it undoes exactly the expects and follows it
made, answers the worker what it adopted (nothing: the worker hands them over again later), and
leaves what it followed before the ask as it was. Asked again which it adopted (the AdoptReply
lost), it answers from its tracking once the adoption under way has ended."""

from __future__ import annotations

import asyncio

from tokenyard.services.router.adopt import on_adopt, on_adopted_ask
from tokenyard.services.router.migration import MigrationConfig, MigrationCore
from tokenyard.shared import codec, subjects
from tokenyard.shared.adoption import AdoptAsk, AdoptedAsk, AdoptReply, StateAsk, StreamState

from tests import builders


def req(rid: str):
    return builders.req(rid, tokens=[1, 2, 3], chain=[], max_tokens=8, reply_to=f"_INBOX.client.{rid}")


class Nc:
    def __init__(self, states=None, error: Exception | None = None):
        self.states, self.error, self.asked = states, error, []

    async def flush(self):
        pass

    async def request(self, subject, data, timeout):
        self.asked.append((subject, codec.decode(data, StateAsk)))
        if self.error is not None:
            raise self.error
        return Msg(codec.encode(self.states))


class Msg:
    def __init__(self, data: bytes, reply: str = "_INBOX.worker.1"):
        self.data, self.reply, self.answers = data, reply, []

    async def respond(self, data: bytes):
        self.answers.append(codec.decode(data, AdoptReply))


class Shell:
    """What on_adopt uses of RouterShell: its follow fails on the `fail_at`-th call (1-based)."""

    instance_id = "router-b"

    def __init__(self, nc: Nc, fail_at: int = 0):
        self.migration = MigrationCore(MigrationConfig())
        self.adoptions: dict[str, asyncio.Event] = {}
        self.nc, self.fail_at, self.calls = nc, fail_at, 0
        self.follows: set[str] = set()
        self._tracking = asyncio.Event()

    async def _follow(self, ar):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("subscribe failed")
        self.follows.add(ar.request_id)

    async def _unfollow(self, rid):
        self.follows.discard(rid)


def ask(*rids: str) -> Msg:
    return Msg(codec.encode(AdoptAsk("w0", [req(r) for r in rids], handover=7)))


async def test_a_follow_that_fails_partway_leaves_nothing_expected_or_followed_and_adopts_nothing():
    shell = Shell(Nc(states=[StreamState(r, [9], 1) for r in ("r1", "r2", "r3", "r4")]), fail_at=3)
    shell.migration.track(req("mine"), "w1", 0.0)  # this router's own request, followed before
    shell.follows.add("mine")
    msg = ask("r1", "r2", "r3", "r4")
    await on_adopt(shell, msg)
    assert shell.calls == 3  # r1, r2 followed, r3's follow raised
    assert shell.migration.adopting == {} and shell.follows == {"mine"}
    assert set(shell.migration.tracked) == {"mine"} and shell.nc.asked == []
    assert msg.answers == [AdoptReply([])] and not shell._tracking.is_set()  # the worker retries later


async def test_a_failed_state_ask_undoes_every_follow_and_a_good_one_adopts_what_the_state_names():
    shell = Shell(Nc(error=TimeoutError()))
    msg = ask("r1", "r2")
    await on_adopt(shell, msg)
    assert shell.nc.asked == [(subjects.worker_state("w0"), StateAsk(["r1", "r2"], 7, "router-b"))]  # the worker's hand-over, this router
    assert (shell.migration.adopting, shell.follows, shell.migration.tracked) == ({}, set(), {})
    assert msg.answers == [AdoptReply([])]
    shell = Shell(Nc(states=[StreamState("r2", [9, 10], 2)]))  # r1 ended meanwhile
    msg = ask("r1", "r2")
    await on_adopt(shell, msg)
    assert shell.follows == {"r2"} and set(shell.migration.tracked) == {"r2"} and shell.migration.adopting == {}
    assert shell.migration.tracked["r2"].token_ids == [9, 10] and shell.migration.tracked["r2"].worker_id == "w0"
    assert msg.answers == [AdoptReply(["r2"])] and shell._tracking.is_set()


class HeldNc(Nc):
    """A state ask answered only when the test says (the worker's state still on its way)."""

    def __init__(self):
        super().__init__()
        self.state: asyncio.Future = asyncio.get_running_loop().create_future()

    async def request(self, subject, data, timeout):
        self.asked.append((subject, codec.decode(data, StateAsk)))
        return Msg(codec.encode(await self.state))


async def test_asked_again_it_names_what_it_follows_on_that_worker_once_the_adoption_under_way_ends():
    shell = Shell(HeldNc())
    shell.migration.track(req("elsewhere"), "w1", 0.0)  # followed, but on another worker
    adopting = asyncio.create_task(on_adopt(shell, ask("r1", "r2")))
    while not shell.nc.asked:  # the state asked, not yet answered: r1 and r2 still being adopted
        await asyncio.sleep(0)
    assert set(shell.adoptions) == {"r1", "r2"}
    again = Msg(codec.encode(AdoptedAsk("w0", ["r1", "r2", "elsewhere", "never"])))
    asking = asyncio.create_task(on_adopted_ask(shell, again))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not asking.done() and again.answers == []  # "not followed" now could be false a moment later
    shell.nc.state.set_result([StreamState("r1", [9], 1)])  # r2 ended meanwhile
    await adopting
    await asking
    assert again.answers == [AdoptReply(["r1"])] and shell.adoptions == {}
    assert set(shell.follows) == {"r1"}


async def test_asked_about_streams_no_adoption_holds_it_answers_at_once_and_bad_input_gets_no_answer():
    shell = Shell(Nc())
    shell.migration.track(req("r1"), "w0", 0.0)
    again = Msg(codec.encode(AdoptedAsk("w0", ["r1", "r2"])))
    await on_adopted_ask(shell, again)
    assert again.answers == [AdoptReply(["r1"])]
    bad = Msg(b"\xc1 not msgpack")
    await on_adopted_ask(shell, bad)
    assert bad.answers == [] and set(shell.migration.tracked) == {"r1"}
