"""The adopting router's side (services/router/adopt.py) with a stand-in for its shell: on any
failure partway (the k-th follow, the state ask) it undoes exactly the expects and follows it
made, answers the worker what it adopted (nothing: the worker hands them over again later), and
leaves what it followed before the ask as it was."""

from __future__ import annotations

import asyncio

from tokenyard.services.router.adopt import on_adopt
from tokenyard.services.router.migration import MigrationConfig, MigrationCore
from tokenyard.shared import codec, subjects
from tokenyard.shared.adoption import AdoptAsk, AdoptReply, StateAsk, StreamState

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
    def __init__(self, data: bytes, reply: str = ""):
        self.data, self.reply, self.answers = data, reply, []

    async def respond(self, data: bytes):
        self.answers.append(codec.decode(data, AdoptReply))


class Shell:
    """What on_adopt uses of RouterShell: its follow fails on the `fail_at`-th call (1-based)."""

    def __init__(self, nc: Nc, fail_at: int = 0):
        self.migration = MigrationCore(MigrationConfig())
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
    return Msg(codec.encode(AdoptAsk("w0", [req(r) for r in rids], handover=7)), reply="_INBOX.worker.1")


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
    assert shell.nc.asked == [(subjects.worker_state("w0"), StateAsk(["r1", "r2"], 7))]  # the worker's hand-over
    assert (shell.migration.adopting, shell.follows, shell.migration.tracked) == ({}, set(), {})
    assert msg.answers == [AdoptReply([])]
    shell = Shell(Nc(states=[StreamState("r2", [9, 10], 2)]))  # r1 ended meanwhile
    msg = ask("r1", "r2")
    await on_adopt(shell, msg)
    assert shell.follows == {"r2"} and set(shell.migration.tracked) == {"r2"} and shell.migration.adopting == {}
    assert shell.migration.tracked["r2"].token_ids == [9, 10] and shell.migration.tracked["r2"].worker_id == "w0"
    assert msg.answers == [AdoptReply(["r2"])] and shell._tracking.is_set()
