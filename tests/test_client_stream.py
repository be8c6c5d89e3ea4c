"""StreamCheck, the receiving end of a stream: `accepted` first, repeats dropped, a gap (or
a `finished` that skips chunks) becomes exactly one error, never a silent short stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenyard.shared.schemas import TERMINAL_EVENTS, Accepted, Chunk, Error, Finished, Usage
from tokenyard.shared.stream_check import GAP_WAIT_S, StreamCheck

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


def test_a_gap_that_stays_open_is_an_error_and_the_end():
    check = StreamCheck("r")
    out = [o for e in [ACC, chunk(0), chunk(2), chunk(3), fin(4)] for o in check.on_event(e, now=1.0)]
    assert out == [ACC, chunk(0)]  # 2, 3 and the end wait for 1
    assert check.expired(1.0 + GAP_WAIT_S - 0.1) is None
    assert check.expired(1.0 + GAP_WAIT_S) == Error("r", 502, "stream lost chunks: expected seq 1, got 2", seq=1)
    assert check.on_event(chunk(1), now=9.0) == []  # too late: the stream is over


def test_a_gap_filled_in_time_is_repaired_in_order():
    check = StreamCheck("r")
    out = [o for e in [ACC, chunk(0), chunk(2), fin(4), chunk(3), chunk(1)] for o in check.on_event(e, now=1.0)]
    assert out == [ACC, chunk(0), chunk(1), chunk(2), chunk(3), fin(4)]
    assert check.expired(100.0) is None


def test_a_finished_that_skips_chunks_is_an_error_once_the_wait_is_over():
    check = StreamCheck("r")
    assert [o for e in [ACC, chunk(0), fin(3)] for o in check.on_event(e, now=0.0)] == [ACC, chunk(0)]
    err = check.expired(GAP_WAIT_S)
    assert isinstance(err, Error) and err.status == 502 and "expected seq 1, got 3" in err.message


def test_an_abort_finish_needs_no_seq():
    assert feed([ACC, fin(0, "abort")]) == [ACC, fin(0, "abort")]


def test_events_that_overtake_accepted_wait_for_it():
    assert feed([chunk(0), chunk(1), ACC, fin(2)]) == [ACC, chunk(0), chunk(1), fin(2)]


@given(st.lists(st.integers(0, 8), max_size=20), st.integers(0, 9))
def test_whatever_arrives_the_stream_is_gapless_or_ends_in_one_error(seqs, end):
    check = StreamCheck("r")
    out = [o for e in [ACC, *map(chunk, seqs), fin(end)] for o in check.on_event(e, now=0.0)]
    if (err := check.expired(GAP_WAIT_S)) is not None:
        out.append(err)
    assert out[0] == ACC
    got = [e.seq for e in out if isinstance(e, Chunk)]
    assert got == list(range(len(got)))  # in order, no repeat, no hole
    terminals = [e for e in out if isinstance(e, TERMINAL_EVENTS)]
    assert len(terminals) == 1 and out[-1] is terminals[0]  # it always ends, exactly once
    if isinstance(terminals[0], Finished):
        assert terminals[0].seq == len(got)  # a finished stream is complete


def first_chunk() -> Chunk:
    """A worker's first chunk: it carries the acceptance (Chunk.accepted)."""
    return Chunk("r", 0, "x", [0], accepted=ACC)


def test_a_first_chunk_that_carries_the_acceptance_is_not_held_for_admissions_copy():
    check = StreamCheck("r")
    assert check.on_event(first_chunk()) == [ACC, first_chunk()]  # at once: the first token waits for nothing
    assert check.on_event(chunk(1)) == [chunk(1)]
    assert check.on_event(ACC) == []  # admission's `accepted`, late: dropped, the stream has it
    assert check.on_event(fin(2)) == [fin(2)]


def test_admissions_accepted_first_then_the_carrying_chunk_yields_one_acceptance():
    assert feed([ACC, first_chunk(), fin(1)]) == [ACC, first_chunk(), fin(1)]


def test_an_error_after_the_carrying_chunk_ends_the_stream():
    """A handed-over request whose store then failed: `accepted` (from the chunk), the chunk, the
    503 that ends it (services/admission/shell.py `_hand_over`); admission's late copy changes nothing."""
    err = Error("r", 503, "queue unavailable", seq=0)
    assert feed([first_chunk(), err, ACC]) == [ACC, first_chunk(), err]


def test_a_later_chunk_that_overtook_the_first_waits_behind_it():
    assert feed([chunk(1), first_chunk(), fin(2)]) == [ACC, first_chunk(), chunk(1), fin(2)]


@given(st.permutations([0, 1, 2, 3]), st.booleans())
def test_in_any_arrival_order_one_acceptance_leads_and_the_tokens_follow_in_order(order, admission_sends):
    """Admission's `accepted`, the carrying first chunk, a second chunk and the end, in any order
    (admission's copy possibly lost): exactly one acceptance, first; both chunks in order; the end last."""
    events = [ACC, first_chunk(), chunk(1), fin(2)]
    arriving = [events[i] for i in order if admission_sends or i != 0]
    out = feed(arriving)
    assert out[0] == ACC and sum(isinstance(e, Accepted) for e in out) == 1
    assert [e.seq for e in out if isinstance(e, Chunk)] == [0, 1]
    assert out[-1] == fin(2)
