"""The chaos probe (bench/faults/chaos.py): its seeded schedule and load, the outcome of a
stream, and — marked slow (≈ 1 min each; deselect with -m "not slow") — a short run on real
processes in each layout (the edge in the queue's process, up's default, or apart): four faults,
nothing lost, hung, duplicated or left running."""

from __future__ import annotations

import argparse

import pytest
from tokenyard.shared import schemas

from bench.faults.chaos import (
    ABORT_SHARE,
    FAULTS,
    LEAD_S,
    HttpStream,
    Stream,
    outcome,
    plan,
    probe_chaos,
    schedule,
)


def test_the_schedule_is_seeded_one_fault_of_each_kind_each_in_the_first_half_of_its_window():
    assert schedule(1, 90) == schedule(1, 90)
    assert schedule(1, 90) != schedule(2, 90)
    faults = schedule(3, 90)
    assert sorted(f.kind for f in faults) == sorted(FAULTS)
    window = (90 - LEAD_S) / len(FAULTS)
    for i, f in enumerate(faults):
        assert LEAD_S + i * window <= f.at_s <= LEAD_S + i * window + window / 2
    with pytest.raises(ValueError, match="--chaos-s 30"):
        schedule(1, 30)


def test_the_load_is_seeded_half_http_half_nats_with_a_tenth_aborted():
    load = plan(1, 90, 6)
    assert load == plan(1, 90, 6) and load != plan(2, 90, 6)
    assert len(load) == 540 and [p.at_s for p in load[:3]] == [0.0, 0.167, 0.333]
    assert sum(p.via == "http" for p in load) == 270
    aborted = [p for p in load if p.abort_after]
    assert abs(len(aborted) / len(load) - ABORT_SHARE) < 0.04
    assert all(p.how in ("cancel", "leave") if p.via == "nats" else p.how == "" for p in aborted)
    assert all(p.max_tokens >= 400 for p in aborted)  # long enough to be running when its client leaves


def test_a_stream_ended_by_the_clients_own_watchdog_is_lost_not_failed_clean():
    idle = Stream("a", 8)
    idle.accepted = True
    idle.on_event(schemas.Error("a", 504, "no event for 60 s"))
    silent = Stream("b", 8)
    silent.accepted = True
    refused = HttpStream("c", 8)
    refused.end("rejected", 503)
    refused.message = "no admission service is running"
    never = Stream("d", 8)
    assert [outcome(s) for s in (idle, silent, refused, never)] == ["lost", "lost", "failed_clean", "hung"]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("layout", ["in-queue", "apart"])  # the edge in the queue's process (up's default), or not
async def test_a_short_chaos_run_loses_nothing(tmp_path, layout):
    args = argparse.Namespace(chaos_seed=1, chaos_s=48.0, chaos_rate=4.0, baseline=None, profile="a100-llama3-8b",
                              log_dir=str(tmp_path), layout=layout)
    row = await probe_chaos(args)
    assert row["layout"] == layout
    assert [f["kind"] for f in row["faults"]] and len(row["faults"]) == 4
    assert row["sent"] == 192
    assert (row["lost"], row["hung"], row["duplicated"], row["silent_short"], row["left_running"]) == (0, 0, 0, 0, 0), row
    assert row["completed"] + row["failed_clean"] + row["aborted"] == row["sent"]


class _Msg:
    def __init__(self, subject: str, event) -> None:
        from tokenyard.shared import codec

        self.subject, self.data, self.headers = subject, codec.encode(event), None


def test_the_wire_count_tells_a_replay_from_a_second_generation():
    from tokenyard.shared.inbox import Inbox

    from bench.faults.chaos import WireCount

    wire = WireCount(nc=None)
    wire._inboxes["in.1"] = Inbox("r1")
    chunk = lambda seq, worker="": schemas.Chunk("r1", seq, "x", [7], worker_id=worker)  # noqa: E731
    for e in (chunk(0, "w0"), chunk(1), chunk(2),
              chunk(0, "w0"), chunk(1), chunk(2),  # a worker's replay after an outage: repeats only
              chunk(3, "w1"), chunk(0, "w2")):    # a migration's re-issue; a second placement from seq 0
        wire._deliver(_Msg("in.1", e))
    wire._deliver(_Msg("in.other", chunk(0, "w0")))  # not an open stream's inbox: not counted
    assert wire.repeats["r1"][0] == 4  # seqs 0, 1, 2 again, and seq 0 from w2
    assert [(w, q) for _, w, q in wire.generations["r1"]] == [("w0", 0), ("w1", 3), ("w2", 0)]
    assert len(wire._inboxes["in.1"].msgs) == 8  # every message still handed on to the stream
