"""Silent ticks (simulator/tick.py): a tick that another follows before the next arrival holds a
changed worker's heartbeat back, because the next send of that worker supersedes it before any
core reads one. That needs, for every core that takes heartbeats, "h1 then h2 leaves what h2
alone leaves" for the heartbeats a simulated worker sends — and those have the shape the
argument assumes (a constant prefill cost, no output share)."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.priority_queue.cli import make_policy
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.slack import prefill_ms_per_token
from tokenyard.shared.schemas import EngineStats, Heartbeat, Phase
from tokenyard.shared.tokenizer import ByteTokenizer
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig

PROF = profile("a100-llama3-8b")
PMT = prefill_ms_per_token(PROF)

stats_st = st.builds(
    EngineStats,
    running=st.integers(0, 40), waiting=st.integers(0, 10), queued_prefill_tokens=st.integers(0, 20_000),
    kv_blocks_used=st.integers(0, 2000), kv_blocks_free=st.integers(0, 2000), block_size=st.just(16),
    step_time_ms=st.floats(0.0, 200.0), prefix_hits=st.integers(0, 100), prefix_queries=st.integers(0, 100),
    tpot_slack_ms=st.none() | st.floats(-50.0, 500.0), compute_util=st.floats(0.0, 1.0),
    prefill_ms_per_token=st.just(PMT), prefill_ms_per_token2=st.just(PROF.p3 / 2),
    decode_ms_per_ctx_token=st.just(PROF.d2),
)
hb_st = st.builds(
    Heartbeat, worker_id=st.sampled_from(["w0", "w1"]), model=st.just("m"), seq=st.integers(0, 9), ts=st.just(0.0),
    stats=stats_st, phase=st.just(Phase.MIXED), healthy=st.booleans(), draining=st.booleans(),
)


def cores():
    return (RouterCore(RouterConfig()), QueueCore(QueueConfig(), make_policy("hybrid")),
            AdmissionCore(AdmissionConfig(models=["m"], block_size=16), ByteTokenizer()))


def admission_held(admission, now: float) -> tuple:
    """Admission's fleet view but its liveness gaps, and which workers it counts up at `now`.
    The gap (liveness.py: a decayed maximum over a worker's heartbeats) is the one thing a
    held-back heartbeat changes: fewer beats, a different gap. It decides only whether a
    worker is up, silence ≤ max(10 × interval, 3 × gap), and a simulated worker's silence at
    any read is at most a keep-alive interval and a tick (0.6 s), below the 1 s floor either
    way: every verdict is the same, as compared here."""
    fleet = admission.fleet
    beats = tuple((w, b.seen_s, b.blind_s, b.interval_s) for w, b in fleet.live.beats.items())
    rest = repr(dataclasses.replace(fleet, live=None))
    return rest, beats, fleet.live.blind_s, tuple(fleet.up(w, now) for w in fleet.workers)


def held(router, queue, admission, now: float) -> tuple:
    """Everything the three cores keep from heartbeats (the queue's `oldest_seen_s` aside: a
    lower bound that only spares a pass over the fleet; admission's liveness gaps aside)."""
    v = router.view
    cols = tuple(getattr(v, c)[: v.n].tobytes() for c in v.COLUMNS)
    return ((tuple(v.ids), tuple(v.stats[: v.n]), cols), tuple((w, repr(r)) for w, r in queue.workers.items()),
            queue.room_sum, admission_held(admission, now))


@settings(max_examples=200, deadline=None)
@given(first=st.lists(hb_st, min_size=1, max_size=4), h1=hb_st, h2=hb_st, keep=st.booleans(),
       times=st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3))
def test_a_later_heartbeat_supersedes_an_earlier_one_in_every_core(first, h1, h2, keep, times):
    h1 = msgspec.structs.replace(h1, worker_id=h2.worker_id)
    t1, t_keep, t2 = sorted(times)
    both, alone = cores(), cores()
    for c in (*both, *alone):  # the same history before
        for k, h in enumerate(first):
            c.on_heartbeat(h, k * 0.01)
    for c in both:  # h1, perhaps a keep-alive of it, then h2
        c.on_heartbeat(h1, t1)
    if keep:
        assert all(c.on_keepalive(h1.worker_id, t_keep) for c in both)
    for c in both:
        c.on_heartbeat(h2, t2)
    for c in alone:
        c.on_heartbeat(h2, t2)
    assert held(*both, t2) == held(*alone, t2)


def test_a_simulated_worker_sends_heartbeats_of_that_shape():
    w = open_workload("mooncake", num_requests=80)
    sim = ClusterSim(SimConfig(instances=8), w.block_tokens, ChainCache())
    sent: list[Heartbeat] = []
    receive = sim.receivers[0]
    sim.receivers[0] = lambda hb, now: (sent.append(hb), receive(hb, now))[1]
    sim.run(w.items())
    # all served but two P1 prompts that cannot answer within 2 × 5 s, both refused at admission
    # (400): an 87k-token one and a 46k-token one (8.33 s of prefill) that, with only H to spare,
    # was admitted with ~0.1 s to wait and expired before its first dispatch (a 429 to retry at
    # once, forever); CLASS_MARGIN_S (2 H) refuses it instead, so nothing expires on this fleet
    beyond = sum(r.refused_code == "beyond_class_cap" for r in sim.reqs.values())
    expired = sum(r.expired for r in sim.reqs.values())
    assert (sum(r.finished for r in sim.reqs.values()), beyond, expired) == (78, 2, 0)
    assert len(sent) > 80 and {hb.stats.prefill_ms_per_token for hb in sent} == {PMT} and PMT > 0
    assert {hb.output_share for hb in sent} == {0.0}  # the simulator runs no stream (WorkerCore.on_output)
