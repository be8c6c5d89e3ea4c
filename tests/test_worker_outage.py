"""A worker around a NATS outage: its terminal events wait for the replay, so `finished` is
always the last thing a stream sends (services/worker/outage.py, and the shell over it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenyard.services.worker import shell as worker_shell
from tokenyard.services.worker.core import WorkerConfig
from tokenyard.services.worker.engine import EngineOutput
from tokenyard.services.worker.outage import OutageReplay
from tokenyard.shared import codec, schemas
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import MODEL, req, stats
from tests.conftest import until

# ───────────────────────────── the pure core ─────────────────────────────

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("chunk"), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 3)),
        st.tuples(st.just("down"), st.just(0)),
        st.tuples(st.just("up"), st.booleans()),
        st.tuples(st.just("back"), st.just(0)),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
        st.tuples(st.just("replay"), st.integers(0, 3)),
    ),
    max_size=80,
)


@dataclass
class Published:
    stream: str
    seq: int
    """-1: the terminal event."""
    t: float
    lost: bool


@given(OPS)
@example([("chunk", 0), ("tick", 0.5), ("down", 0), ("end", 0), ("up", True)])  # the end overtook a lost chunk
@example([("down", 0), ("up", False), ("chunk", 0), ("tick", 2.0), ("replay", 1), ("down", 0)])  # a replayed end lost
@settings(max_examples=300)
def test_a_reader_that_stops_at_the_terminal_event_has_every_chunk_by_then(ops):
    """A reader loses what is published in the last `before_s` before a disconnect and, after
    the reconnect, what goes out before it has resubscribed (the worker's buffer, flushed on
    reconnect, if the reader is not back yet; live events until it is back); it is back by
    the time the replay starts. Whatever the order of sends, outages, reconnects, the reader's
    return and replay batches (with sends between batches): at the first terminal event it
    reads of a stream, it has every chunk that stream sent; and once the connection is up
    and the replay drained, every ended stream's end was read."""
    before_s = 1.0
    core = OutageReplay(after_s=2.0, before_s=before_s, max_events=1_000)
    now, connected, reconnects, reader_back = 0.0, True, 0, True
    published: list[Published] = []
    buffered: list[Published] = []
    sent: dict[str, int] = {}
    ended: set[str] = set()

    def send(stream: str, end: bool) -> None:
        seq = -1 if end else sent.get(stream, 0)
        if end:
            ended.add(stream)
        else:
            sent[stream] = seq + 1
        core.observe(now, reconnects)
        if core.send(now, connected, (stream, str(seq).encode(), None), terminal=end):
            p = Published(stream, seq, now, lost=connected and not reader_back)
            (published if connected else buffered).append(p)

    def replay(interleave: int) -> None:
        nonlocal reader_back
        reader_back = True
        while batch := core.take(now, connected):
            published.extend(Published(s, int(d), now, False) for s, d, _ in batch)
            for k in range(interleave):  # streams that make progress while the first batch goes out
                if f"s{k}" not in ended:
                    send(f"s{k}", end=k % 2 == 0)
            interleave = 0

    def up(reader_first: bool) -> None:
        nonlocal connected, reconnects, reader_back
        connected, reconnects, reader_back = True, reconnects + 1, reader_first
        for p in buffered:  # nats-py flushes its buffer on reconnect
            p.lost = not reader_first
        published.extend(buffered)
        buffered.clear()

    for op, arg in ops:
        if op in ("chunk", "end") and f"s{arg}" not in ended:
            send(f"s{arg}", end=op == "end")
        elif op == "down" and connected:
            connected, reader_back = False, False
            for p in published:
                p.lost |= p.t > now - before_s
        elif op == "up" and not connected:
            up(arg)
        elif op == "back" and connected:
            reader_back = True
        elif op == "tick":
            now += arg
        elif op == "replay" and core.pending and now >= core.due_at:
            replay(arg)
    if not connected:
        up(False)
    core.observe(now, reconnects)
    if core.pending:
        replay(0)

    read = [p for p in published if not p.lost]
    for stream in ended:
        seqs = [p.seq for p in read if p.stream == stream]
        assert -1 in seqs, (stream, "its end never read")
        assert set(seqs[: seqs.index(-1)]) == set(range(sent.get(stream, 0))), (stream, seqs)
    assert not core.pending


def test_an_outage_holds_the_terminal_event_and_replays_what_the_clients_may_have_missed():
    core = OutageReplay(after_s=2.0, before_s=1.0)
    assert core.send(0.0, True, ("a", b"0", None), terminal=False)  # long before: not replayed
    assert core.send(5.0, True, ("a", b"1", None), terminal=False)  # within before_s of the outage
    assert core.send(5.5, False, ("a", b"2", None), terminal=False)  # published (buffered), kept
    assert not core.send(5.6, False, ("a", b"end", None), terminal=True)  # held
    assert core.observe(7.0, reconnects=1) and core.due_at == 9.0
    assert not core.send(7.5, True, ("b", b"end", None), terminal=True)  # unsure until replayed
    assert [d for _, d, _ in core.take(9.0, connected=True)] == [b"1", b"2", b"end", b"end"]
    assert core.take(9.0, connected=True) == [] and not core.pending
    assert core.send(9.1, True, ("c", b"end", None), terminal=True)  # steady again


def test_a_replay_due_while_the_connection_is_down_again_waits_for_the_next_reconnect():
    core = OutageReplay(after_s=2.0)
    core.observe(0.0, reconnects=1)
    assert not core.send(1.0, False, ("a", b"end", None), terminal=True)
    assert core.take(3.0, connected=False) == [] and core.pending
    assert core.observe(3.0, reconnects=2) and core.due_at == 5.0
    assert core.take(9.0, connected=True) == [("a", b"end", None)]


def test_chunks_past_the_cap_are_dropped_but_terminal_events_are_kept():
    core = OutageReplay(max_events=2)
    for seq in range(4):
        core.send(0.0, False, ("a", str(seq).encode(), None), terminal=False)
    core.send(0.0, False, ("a", b"end", None), terminal=True)
    core.observe(0.0, reconnects=1)
    assert [d for _, d, _ in core.take(9.0, connected=True)] == [b"0", b"1", b"end"]


# ───────────────────────────── the shell ─────────────────────────────


class FakeNats:
    """The three things the worker's stream path uses of a nats-py Client."""

    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}
        self.published: list[schemas.StreamEvent] = []

    async def publish(self, subject: str, data: bytes, headers=None) -> None:
        self.published.append(codec.decode_event(data, headers))


class StepEngine:
    """An engine whose one request makes a token each time the test says so."""

    name = "step"

    def __init__(self) -> None:
        self.steps: asyncio.Queue[EngineOutput | None] = asyncio.Queue()

    async def generate(self, req):
        while True:
            out = await self.steps.get()
            if out is None:  # the request ends with no further output (an abort)
                return
            yield out
            if out.finished:
                return

    def stats(self):
        return stats()


async def test_the_shell_sends_finished_after_the_replay_of_the_chunks_it_covers(monkeypatch):
    """Tokens 0-2 go out before nats-server dies, 3-4 and the end while it is down; after the
    reconnect the replay sends 0-4 again. Before this rule the `finished` went out live
    (buffered, flushed on reconnect) and the replayed chunks after it: a reader that stops at
    `finished` saw a stream with holes end normally."""
    monkeypatch.setattr(worker_shell, "REPLAY_AFTER_S", 0.05)
    engine = StepEngine()
    shell = worker_shell.WorkerShell(WorkerConfig("w0", MODEL), engine, ByteTokenizer())
    shell.nc = nc = FakeNats()
    ar = req("r1", max_tokens=5)
    _, start = shell.core.offer(ar, stats())
    assert start
    generating = asyncio.create_task(shell.generate(ar, None))

    async def token(finished: bool = False) -> None:
        await engine.steps.put(EngineOutput("r1", [65], finished=finished, finish_reason="length" if finished else None))
        await until(lambda: engine.steps.empty())

    for _ in range(3):
        await token()
    await until(lambda: len(nc.published) == 3)
    nc.is_connected = False
    await token()
    await token(finished=True)
    await generating
    nc.is_connected, nc.stats["reconnects"] = True, 1
    shell.check_reconnect()
    # the replay: the three chunks of the last second, the two of the outage, and the end
    await until(lambda: sum(isinstance(e, schemas.Chunk) for e in nc.published) >= 3 + 2 + 5
                and isinstance(nc.published[-1], schemas.Finished), timeout_s=5)
    first_end = next(i for i, e in enumerate(nc.published) if isinstance(e, schemas.Finished))
    assert first_end == len(nc.published) - 1, [type(e).__name__ for e in nc.published]
    assert nc.published[-1].seq == 5
    assert sorted({e.seq for e in nc.published[:-1]}) == [0, 1, 2, 3, 4]
