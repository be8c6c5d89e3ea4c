"""Folding across ticks (simulator/across.py): an engine's pure decode steps run past the
100 ms ticks that read only its stats. Whoever looks at a tick must see what one stepping
one by one sees there, and every token, finish and block must come out the same."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES
from tokenyard.shared.schemas import BlockRemoved, BlockStored
from tokenyard.simulator.across import Ticks, fold_across
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig
from tokenyard.simulator.fleet import SimInstance
from tokenyard.simulator.metrics import WALL_CLOCK_KEYS, result

from tests.test_sim_advance import BS, mixes, req
from tests.test_sim_silent_ticks import admission_held

TICK_S = 0.0137
"""Ticks at k · TICK_S + TICK0, a few decode steps apart (no step ends exactly on one)."""
TICK0 = 0.00071


def reads(t: float, horizon: float) -> bool:
    """With silent ticks and no sampling: a tick reads the stats only where the next tick is
    not before the next arrival (tick.silent)."""
    return t + TICK_S >= horizon


def drive(mix, budget, blocks, across: bool, host: int = 0, mode: str = "recompute", quiet: bool = False):
    """One engine on a virtual clock with arrivals and ticks. Each tick records the engine's
    stats as it sees them: one by one, those after the step across it started; `across`,
    the kept ones (SimInstance.ahead) where a fold crossed it. `quiet`: the fold keeps stats
    only for the ticks that read them (silent ticks, no sampling); only those are recorded."""
    prof = dataclasses.replace(PROFILES["h100-llama3-8b"], max_num_batched_tokens=budget)
    core = SimEngineCore(prof, BS, blocks, host_blocks=host, preemption_mode=mode)
    inst = SimInstance("w0", "m", prof, BS, blocks, 50.0)
    inst.engine = core
    arrivals = sorted(((at * 0.01, k, req(k, p, own, mt)) for k, (p, own, mt, at) in enumerate(mix)),
                      key=lambda a: (a[0], a[1]))
    now, i, tick = 0.0, 0, TICK0
    tokens: list[tuple[str, int, float]] = []
    finished: dict[str, float] = {}
    index: set[tuple[int, str]] = set()
    looks: list[tuple[float, object]] = []
    steps = 0
    while i < len(arrivals) or core.has_work():
        while i < len(arrivals) and arrivals[i][0] <= now:
            core.add(arrivals[i][2])
            i += 1
        if not core.has_work():
            now = arrivals[i][0]
            while tick <= now:
                tick += TICK_S
            continue
        horizon = arrivals[i][0] if i < len(arrivals) else float("inf")
        r = None
        if across:
            ticks = Ticks(tick, horizon, TICK_S, quiet, 0.0, 1e9)  # (sampling: never)
            r = fold_across(inst, now, ticks, horizon) if tick < horizon else core.fold(now, horizon, straddle=True)
        if r is None:
            r = core.step()
        durations = r.step_durations or [r.duration_s]
        times = []
        t = now
        for d in durations:
            t += d
            times.append(t)
        kept = dict(inst.ahead)
        inst.ahead.clear()
        while tick <= t:  # the ticks this result's steps crossed
            if not quiet or reads(tick, horizon):
                looks.append((tick, kept.get(tick) or core.stats()))
            tick += TICK_S
        for o in r.outputs:
            for j, tok in enumerate(o.new_token_ids):
                tokens.append((o.request_id, tok, times[j]))
            if o.finished:
                finished[o.request_id] = times[len(o.new_token_ids) - 1] if o.new_token_ids else times[0]
        now = t
        steps += r.num_steps
        for e in core.pool.drain_events():
            if isinstance(e, BlockStored):
                index.update((h, e.medium) for h in e.block_hashes)
            elif isinstance(e, BlockRemoved):
                index.difference_update((h, e.medium) for h in e.block_hashes)
        assert steps < 5000
    return sorted(tokens), finished, index, steps, now, looks


@settings(max_examples=40, deadline=None)
@given(mix=mixes, budget=st.integers(4, 32), blocks=st.integers(24, 80), host=st.integers(0, 8),
       mode=st.sampled_from(["recompute", "swap"]))
def test_folding_across_ticks_is_step_by_step(mix, budget, blocks, host, mode):
    a = drive(mix, budget, blocks, False, host, mode)
    b = drive(mix, budget, blocks, True, host, mode)
    assert a[:5] == b[:5]  # every token at the same time, finishes, cached blocks, steps, the end
    assert a[5] == b[5]  # at every tick, the same stats


@settings(max_examples=40, deadline=None)
@given(mix=mixes, budget=st.integers(4, 32), blocks=st.integers(24, 80), host=st.integers(0, 8),
       mode=st.sampled_from(["recompute", "swap"]))
def test_folding_across_silent_ticks_keeps_the_stats_of_the_ticks_that_read_them(mix, budget, blocks, host, mode):
    a = drive(mix, budget, blocks, False, host, mode, quiet=True)
    b = drive(mix, budget, blocks, True, host, mode, quiet=True)
    assert a[:5] == b[:5]
    assert a[5] == b[5]  # at every tick that reads the stats (the last before each arrival), the same


def test_a_fold_across_silent_ticks_stops_only_at_the_ticks_that_read():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)
    core.add(req(0, 0, 6, 60))
    core.step()
    inst = SimInstance("w0", "m", core.prof, BS, 64, 50.0)
    inst.engine = core
    horizon = 0.43  # ticks at 0.05 … 0.35: 0.35 is the last before it; 0.25 samples (a second after 0.25 − 1)
    ticks = Ticks(0.05, horizon, 0.1, True, 0.25 - 1.0, 1.0)
    res = fold_across(inst, 0.0, ticks, horizon)
    assert [(round(t, 9), r) for t, r in ticks.listed] == [(0.05, False), (0.15, False), (0.25, True), (0.35, True)]
    assert [(round(t, 9), s is None) for t, s in inst.ahead] == [(0.05, True), (0.15, True), (0.25, False),
                                                                  (0.35, False)]
    one = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)  # the same engine, one piece per tick
    one.add(req(0, 0, 6, 60))
    one.step()
    each = SimInstance("w1", "m", one.prof, BS, 64, 50.0)
    each.engine = one
    again = fold_across(each, 0.0, Ticks(0.05, horizon, 0.1, False, None, 1.0), horizon)
    assert again.step_durations == res.step_durations and again.outputs == res.outputs
    assert [s for t, s in each.ahead if t > 0.2] == [s for t, s in inst.ahead if s is not None]
    inst.ahead.popleft()
    with pytest.raises(AssertionError, match="kept for no one"):  # a silent tick reads nothing
        inst.stats_at(inst.ahead[0][0])


def test_a_fold_crosses_ticks_and_keeps_the_stats_of_each():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)
    core.add(req(0, 0, 6, 60))
    core.add(req(1, 0, 3, 8))
    core.step()
    inst = SimInstance("w0", "m", core.prof, BS, 64, 50.0)
    inst.engine = core
    res = fold_across(inst, 0.0, Ticks(0.05, float("inf"), 0.1, True, None, 1.0), float("inf"))
    # r1 finishes after 7 more steps, r0 runs to its 60th token: every step of both in one result
    assert res.num_steps == 59 and [len(o.new_token_ids) for o in res.outputs] == [59, 7]
    assert all(o.finished for o in res.outputs) and not core.has_work()
    ends, t = [], 0.0
    for d in res.step_durations:  # each step's end, summed as the loop sums them
        t += d
        ends.append(t)
    ticks, tick = [], 0.05
    while tick <= ends[-1]:
        ticks.append(tick)
        tick += 0.1
    assert [t for t, _ in inst.ahead] == ticks
    for t, stats in inst.ahead:  # the step across t had started: its tokens were made
        k = next(k for k, e in enumerate(ends) if e >= t)
        assert stats.running == (2 if k < 6 else 1 if k < 58 else 0)
        assert stats.step_time_ms == res.step_durations[k] * 1000.0


def test_a_fold_across_ticks_stops_before_the_horizon():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)
    core.add(req(0, 0, 6, 60))
    core.step()
    inst = SimInstance("w0", "m", core.prof, BS, 64, 50.0)
    inst.engine = core
    horizon = 0.33
    res = fold_across(inst, 0.0, Ticks(0.05, horizon, 0.1, False, None, 1.0), horizon)
    end = sum(res.step_durations)
    assert end < horizon  # its STEP_DONE comes before the horizon's look
    assert [round(t, 9) for t, _ in inst.ahead] == [0.05, 0.15, 0.25]
    assert res.outputs[0].new_token_ids and not res.outputs[0].finished


def _cores(sim: ClusterSim, now: float) -> tuple:
    """What the router, queue and admission cores hold from heartbeats, exactly: the router's
    rows (every column's bytes), the queue's per-worker records and headroom sum, admission's
    fleet view (its queue state too) and which workers it counts up. Not the queue's
    `oldest_seen_s`, a lower bound that only spares a pass over the fleet, nor admission's
    liveness gaps (test_sim_silent_ticks: `held`)."""
    v = sim.router.view
    cols = tuple(getattr(v, c)[: v.n].tobytes() for c in v.COLUMNS)
    queue = tuple((w, repr(rec)) for w, rec in sim.queue.workers.items())
    return (tuple(v.ids), tuple(v.stats[: v.n]), cols, v.decisions), (queue, sim.queue.room_sum), admission_held(sim.admission, now)


def _replay(spec: dict, cfg):
    spec = dict(spec)
    w = open_workload(spec.pop("name"), **spec)
    items = w.items()
    sim = ClusterSim(cfg, w.block_tokens, ChainCache())
    seen: list[tuple] = []  # every heartbeat every core took: (core, time, worker, stats)
    sim.receivers = [
        (lambda hb, now, k=k, f=f: (seen.append((k, now, hb.worker_id, hb.stats)), f(hb, now))[1])
        for k, f in enumerate(sim.receivers)
    ]
    reads: list[tuple] = []  # what the cores hold at every arrival, when admission and the router read them
    arrive = sim.arrive
    sim.arrive = lambda item, now: (reads.append((now, _cores(sim, now))), arrive(item, now))[1]
    sim.run(items)
    res = {k: v for k, v in result(sim, items, {"ttft": 2000.0, "tpot": 100.0}).items() if k not in WALL_CLOCK_KEYS}
    per_req = [(rid, list(s.tokens), s.finished, s.error, s.cached_tokens, s.worker) for rid, s in sorted(sim.reqs.items())]
    insts = [(i.id, i.steps, i.busy_s, list(i.bs_samples)) for i in sim.instances]
    return per_req, res, insts, reads, seen, sim.step_events


@pytest.mark.parametrize(
    ("spec", "cfg", "gaps"),
    [
        (dict(name="mooncake", num_requests=150), SimConfig(instances=16), True),
        # 150 arrivals in 2.7 s (none 100 ms after the last): no tick is silent before the last one
        (dict(name="chatbot", num_requests=150, priority_mix=(0.1, 0.4, 0.3, 0.2)), SimConfig(instances=4), False),
        (dict(name="mooncake", num_requests=120), SimConfig(instances=64), True),
    ],
    ids=["mooncake", "chatbot-classes", "mooncake-64"],
)
def test_the_cluster_simulator_folds_across_ticks_without_changing_a_result(spec, cfg, gaps):
    one_by_one = _replay(spec, dataclasses.replace(cfg, fold_decodes=False, quiet_ticks=False))
    per_tick = _replay(spec, dataclasses.replace(cfg, fold_ticks=False, quiet_ticks=False))
    loud = _replay(spec, dataclasses.replace(cfg, quiet_ticks=False))
    across = _replay(spec, cfg)
    # every token at the same time, every result, busy time and batch-size sample, and what
    # every core holds whenever a request arrives
    assert across[:4] == loud[:4] == one_by_one[:4] == per_tick[:4]
    # every heartbeat each core took, at the same time with the same stats, where every tick sends them
    assert loud[4] == one_by_one[4] == per_tick[4]
    if gaps:  # silent ticks held heartbeats back; folds went across ticks, and further
        assert len(across[4]) < len(loud[4]) and across[5] < loud[5] < per_tick[5]
    else:
        assert len(across[4]) <= len(loud[4]) and across[5] <= loud[5] <= per_tick[5]
