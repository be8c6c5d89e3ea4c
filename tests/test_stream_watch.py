"""StreamWatch (shared/stream_watch.py), pure: when a client probes a silent stream's worker,
when two "no responders" prove it gone, when the stream is resumed (once), and when given up."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.shared.stream_watch import (
    FLOOR_S,
    ROUTER_GRACE_S,
    ResumeDue,
    StreamWatch,
    WorkerGone,
    WorkerProbe,
)


def running(gaps: list[float], worker: str = "w0") -> tuple[StreamWatch, float]:
    """A watch whose stream's chunks came at 0 and then after each of `gaps`; the last one's time."""
    w, now = StreamWatch(), 0.0
    w.on_chunk(now, worker)
    for g in gaps:
        now += g
        w.on_chunk(now)
    return w, now


def test_nothing_is_probed_before_the_stream_names_its_worker():
    w = StreamWatch()
    w.on_event(0.0)  # accepted
    w.on_chunk(0.1)  # a chunk of a fleet that does not name its worker
    assert [w.tick(t) for t in (5.0, 50.0, 500.0)] == [None, None, None]


def test_the_silence_bound_is_the_streams_own_gaps_floored_and_capped():
    assert running([0.02, 0.05, 0.03])[0].bound_s() == FLOOR_S  # 4 × 0.05 s is under the floor
    assert running([0.02, 1.5, 0.03])[0].bound_s() == 6.0       # 4 × its longest gap
    assert running([0.02, 30.0])[0].bound_s() == 10.0           # capped


def prove_gone(w: StreamWatch, since: float) -> float:
    """Two probes FLOOR_S apart after a silence of the bound, both "no responders": the proof's time."""
    p1 = w.tick(since + w.bound_s())
    w.on_probe(True, p1.sent_s)
    p2 = w.tick(p1.sent_s + max(FLOOR_S, w.bound_s()))
    w.on_probe(True, p2.sent_s)
    return p2.sent_s


def test_two_no_responders_floor_apart_prove_it_gone_and_it_is_resumed_at_once():
    w, last = running([0.25, 0.25])
    assert w.tick(last + 2.9) is None
    first = w.tick(last + 3.0)
    assert first == WorkerProbe("w0", last + 3.0)
    assert w.tick(last + 3.5) is None  # one probe at a time
    w.on_probe(True, first.sent_s)
    assert w.tick(first.sent_s + FLOOR_S - 0.1) is None  # the second waits FLOOR_S after the first
    second = w.tick(first.sent_s + FLOOR_S)
    assert second == WorkerProbe("w0", first.sent_s + FLOOR_S)
    w.on_probe(True, second.sent_s)
    assert w.gone_s == second.sent_s
    assert w.tick(second.sent_s) == ResumeDue("w0", second.sent_s)  # nobody moved it: at once


def test_a_resumed_stream_lost_again_is_given_up_only_after_the_routers_grace():
    w, last = running([0.25])
    proven = prove_gone(w, last)
    w.on_resumed(proven + 0.5)
    assert w.worker_id == "" and w.tick(proven + 100.0) is None  # the new generation names its worker
    w.on_chunk(proven + 1.0, "w1")
    again = prove_gone(w, proven + 1.0)
    assert w.tick(again) is None  # not a second resume: a router placed this one and may move it
    assert w.tick(again + ROUTER_GRACE_S - 0.1) is None
    assert w.tick(again + ROUTER_GRACE_S) == WorkerGone("w1", again)


def test_an_answer_or_a_timeout_between_restarts_the_proof():
    w, last = running([0.25])
    p1 = w.tick(last + 3.0)
    w.on_probe(True, p1.sent_s)
    p2 = w.tick(p1.sent_s + 3.0)
    w.on_probe(False, p2.sent_s)  # answered (or timed out): alive or late as of p2
    assert w.suspect_s is None and w.alive_s == p2.sent_s
    p3 = w.tick(p2.sent_s + 3.0)
    w.on_probe(True, p3.sent_s)
    assert w.gone_s is None  # one "no responders" again, not two
    p4 = w.tick(p3.sent_s + 3.0)
    w.on_probe(True, p4.sent_s)
    assert w.gone_s == p4.sent_s


def test_chunks_after_the_proof_a_router_moved_it_clear_everything():
    w, last = running([0.25])
    p1 = w.tick(last + 3.0)
    w.on_probe(True, p1.sent_s)
    p2 = w.tick(p1.sent_s + 3.0)
    w.on_probe(True, p2.sent_s)
    assert w.gone_s is not None
    w.on_chunk(p2.sent_s + 2.0, "w1")  # the router's re-issue: its first chunk names the new worker
    assert w.gone_s is None and w.worker_id == "w1"
    assert w.tick(p2.sent_s + ROUTER_GRACE_S + 1.0) is None  # within the bound of that chunk
    probe = w.tick(p2.sent_s + 2.0 + w.bound_s())
    assert probe is not None and probe.worker_id == "w1"


def test_an_answer_to_a_probe_sent_before_the_last_event_is_ignored():
    w, last = running([0.25])
    p1 = w.tick(last + 3.0)
    w.on_chunk(p1.sent_s + 0.5)  # the stream went on while the probe was out
    w.on_probe(True, p1.sent_s)
    assert w.suspect_s is None and w.probing_s is None


def test_a_reconnect_of_the_client_restarts_every_clock():
    w, last = running([0.25])
    p1 = w.tick(last + 3.0)
    w.on_reconnected(p1.sent_s + 0.2)
    w.on_probe(True, p1.sent_s)  # sent before the reconnect: ignored
    assert w.suspect_s is None and w.tick(p1.sent_s + 3.0) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 4.0), st.sampled_from(["chunk", "gone", "alive", "none"])),
                min_size=1, max_size=60))
def test_never_resumed_or_given_up_without_two_refusals_floor_apart(steps):
    """Whatever the order of chunks and probe answers: a ResumeDue (once) and then a WorkerGone
    come only after two "no responders" at least FLOOR_S apart with no event or other answer
    after the first, the WorkerGone ROUTER_GRACE_S after them; no probe within the bound."""
    w = StreamWatch()
    now = 0.0
    w.on_chunk(now, "w0")
    refusals: list[float] = []  # the "no responders" since the last sign of life
    out = None
    resumes = 0
    for dt, what in steps:
        now += dt
        if what == "chunk":
            w.on_chunk(now)
            refusals.clear()
        effect = w.tick(now)
        if isinstance(effect, WorkerProbe):
            assert now - w.alive_s >= w.bound_s()
            if what == "gone":
                w.on_probe(True, effect.sent_s)
                refusals.append(effect.sent_s)
            elif what == "alive":
                w.on_probe(False, effect.sent_s)
                refusals.clear()
            else:
                w.on_probe(False, effect.sent_s)  # a timeout: alive or late
                refusals.clear()
        elif isinstance(effect, ResumeDue):
            assert len(refusals) >= 2 and refusals[1] - refusals[0] >= FLOOR_S and resumes == 0
            resumes += 1
            w.on_resumed(now)
            w.on_chunk(now, "w1")  # the new generation names its worker
            refusals.clear()
        elif isinstance(effect, WorkerGone):
            out = effect
            assert resumes == 1 and len(refusals) >= 2 and refusals[1] - refusals[0] >= FLOOR_S
            assert now - effect.proven_s >= ROUTER_GRACE_S
            break
    if out is None and w.gone_s is not None:
        assert len(refusals) >= 2
