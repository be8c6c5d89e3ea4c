"""StreamCheck, the receiving end of a stream: `accepted` first, repeats dropped, a gap (or
a `finished` that skips chunks) becomes exactly one error, never a silent short stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenyard.shared.client import StreamCheck
from tokenyard.shared.schemas import TERMINAL_EVENTS, Accepted, Chunk, Error, Finished, Usage

ACC = Accepted("r", 1, 3)


def chunk(seq: int) -> Chunk:
    return Chunk("r", seq, "x", [seq])


def fin(seq: int, reason: str = "length") -> Finished:
    return Finished("r", seq, reason, Usage(3, seq, 3 + seq))


def feed(events) -> list:
    check = StreamCheck("r")
    return [out for e in events for out in check.on_event(e)]


def test_an_ordinary_stream_passes_unchanged():
    events = [ACC, chunk(0), chunk(1), fin(2)]
    assert feed(events) == events


def test_repeats_are_dropped():
    assert feed([ACC, chunk(0), chunk(1), chunk(1), chunk(0), chunk(2), fin(3)]) == [
        ACC, chunk(0), chunk(1), chunk(2), fin(3)]


def test_a_gap_is_an_error_and_the_end():
    out = feed([ACC, chunk(0), chunk(2), chunk(3), fin(4)])
    assert out[:2] == [ACC, chunk(0)]
    assert out[2] == Error("r", 502, "stream lost chunks: expected seq 1, got 2", seq=1) and len(out) == 3


def test_a_finished_that_skips_chunks_is_an_error():
    out = feed([ACC, chunk(0), fin(3)])
    assert isinstance(out[-1], Error) and out[-1].status == 502


def test_an_abort_finish_needs_no_seq():
    assert feed([ACC, fin(0, "abort")]) == [ACC, fin(0, "abort")]


def test_events_that_overtake_accepted_wait_for_it():
    assert feed([chunk(0), chunk(1), ACC, fin(2)]) == [ACC, chunk(0), chunk(1), fin(2)]


@given(st.lists(st.integers(0, 8), max_size=20), st.integers(0, 9))
def test_whatever_arrives_the_stream_is_gapless_or_ends_in_one_error(seqs, end):
    out = feed([ACC, *map(chunk, seqs), fin(end)])
    assert out[0] == ACC
    got = [e.seq for e in out if isinstance(e, Chunk)]
    assert got == list(range(len(got)))  # in order, no repeat, no hole
    terminals = [e for e in out if isinstance(e, TERMINAL_EVENTS)]
    assert len(terminals) <= 1 and (not terminals or out[-1] is terminals[0])
    if terminals and isinstance(terminals[0], Finished):
        assert terminals[0].seq == len(got)  # a finished stream is complete
