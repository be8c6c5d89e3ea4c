"""`advance(now, until)` folds identical decode steps (fold.py); a driver that uses it must see
exactly what one calling `step()` sees: every token of every request at the same virtual time,
the same finishes, the same cached blocks, the same stats. The cluster simulator folds between
the events that look at an engine; its results with and without folding are the same."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import PROFILES
from tokenyard.shared.schemas import AdmittedRequest, BlockRemoved, BlockStored
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig
from tokenyard.simulator.metrics import WALL_CLOCK_KEYS, result

from tests import builders

BS = 4


def req(k: int, prefix: int, own: int, max_tokens: int) -> AdmittedRequest:
    """Request k: a prompt of `prefix` shared tokens and `own` of its own."""
    toks = list(range(prefix)) + [1000 + 10 * k + j for j in range(own)]
    return builders.req(f"r{k}", tokens=toks, max_tokens=max_tokens, block_size=BS)


def drive(mix, budget, blocks, fold: bool, host: int = 0, mode: str = "recompute", straddle: bool = False):
    prof = dataclasses.replace(PROFILES["h100-llama3-8b"], max_num_batched_tokens=budget)
    core = SimEngineCore(prof, BS, blocks, host_blocks=host, preemption_mode=mode)
    arrivals = sorted(((at * 0.01, k, req(k, p, own, mt)) for k, (p, own, mt, at) in enumerate(mix)),
                      key=lambda a: (a[0], a[1]))
    now, i = 0.0, 0
    tokens: list[tuple[str, int, float]] = []
    finished: dict[str, float] = {}
    index: set[tuple[int, str]] = set()
    steps = 0
    stats = []
    while i < len(arrivals) or core.has_work():
        while i < len(arrivals) and arrivals[i][0] <= now:
            core.add(arrivals[i][2])
            i += 1
        if not core.has_work():
            now = arrivals[i][0]
            continue
        until = arrivals[i][0] if i < len(arrivals) else float("inf")
        r = core.advance(now, until, straddle=straddle) if fold else core.step()
        durations = r.step_durations or [r.duration_s]
        times = []
        t = now
        for d in durations:
            t += d
            times.append(t)
        for o in r.outputs:
            for j, tok in enumerate(o.new_token_ids):
                tokens.append((o.request_id, tok, times[j]))
            if o.finished:
                finished[o.request_id] = times[len(o.new_token_ids) - 1] if o.new_token_ids else times[0]
        now = times[-1]
        steps += r.num_steps
        for e in core.pool.drain_events():
            if isinstance(e, BlockStored):
                index.update((h, e.medium) for h in e.block_hashes)
            elif isinstance(e, BlockRemoved):
                index.difference_update((h, e.medium) for h in e.block_hashes)
        assert steps < 5000
        assert core.has_work() == bool(core.running or core.waiting or core.aborted)
        assert set(core.seqs.values()) == {*core.running, *core.waiting}
        stats.append((now, core.stats()))
    return sorted(tokens), finished, index, steps, now, stats


mixes = st.lists(st.tuples(st.sampled_from([0, 8]), st.integers(1, 9), st.integers(1, 40), st.integers(0, 30)),
                 min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(mix=mixes, budget=st.integers(4, 32), blocks=st.integers(24, 80), host=st.integers(0, 8),
       mode=st.sampled_from(["recompute", "swap"]))
def test_advance_is_step_by_step(mix, budget, blocks, host, mode):
    a = drive(mix, budget, blocks, False, host, mode)
    seen = dict(a[5])
    for straddle in (False, True):
        b = drive(mix, budget, blocks, True, host, mode, straddle)
        assert a[0] == b[0]  # every token, at the same time
        assert a[1] == b[1] and a[2] == b[2] and a[3] == b[3]
        assert a[4] == b[4]
        # what the engine reports wherever the folding driver looks (at every fold's end) is
        # what the step-by-step driver sees at the same time
        assert all(seen[t] == s for t, s in b[5])


def test_a_fold_of_pure_decode_steps():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)
    core.add(req(0, 0, 6, 10))
    core.add(req(1, 0, 3, 5))
    first = core.advance()
    assert first.num_steps == 1  # a prefill step is never folded
    r = core.advance()
    # r1 has 4 tokens left, r0 9: 4 steps of both (contexts (6+1)+(3+1), +2 per step), then r0
    # alone (context 7 + j at the fold's step j)
    a100 = PROFILES["a100-llama3-8b"]
    assert r.num_steps == 9 and [len(o.new_token_ids) for o in r.outputs] == [9, 4]
    assert r.outputs[0].finished and r.outputs[1].finished and not core.has_work()
    assert r.step_durations == [a100.step_s(2, 11 + 2 * j, []) for j in range(4)] + [
        a100.step_s(1, 7 + j, []) for j in range(4, 9)
    ]
    assert r.duration_s == sum(r.step_durations) and r.scheduled_tokens == 13


def test_a_fold_stops_at_the_horizon_and_max_steps():
    core = SimEngineCore(PROFILES["a100-llama3-8b"], BS, 64)
    core.add(req(0, 0, 6, 50))
    core.step()
    d = PROFILES["a100-llama3-8b"].step_s(1, 7, [])
    assert core.advance(until=0.0).num_steps == 1  # a horizon already reached: one step still runs
    assert core.advance(0.0, until=2.5 * d).num_steps == 2  # steps end at ~d, ~2d < 2.5d; ~3d is not before
    assert core.advance(max_steps=5).num_steps == 5


def _replay(spec: dict, cfg, fold: bool):
    spec = dict(spec)
    w = open_workload(spec.pop("name"), **spec)
    items = w.items()
    sim = ClusterSim(dataclasses.replace(cfg, fold_decodes=fold), w.block_tokens, ChainCache())
    sim.run(items)
    res = {k: v for k, v in result(sim, items, {"ttft": 2000.0, "tpot": 100.0}).items() if k not in WALL_CLOCK_KEYS}
    per_req = [(rid, list(s.tokens), s.finished, s.error, s.cached_tokens, s.worker) for rid, s in sorted(sim.reqs.items())]
    return per_req, res, [(i.id, i.steps, i.busy_s, list(i.bs_samples)) for i in sim.instances], sim.step_events


@pytest.mark.parametrize(
    ("spec", "cfg"),
    [
        (dict(name="mooncake", num_requests=150), SimConfig(instances=16)),
        (dict(name="chatbot", num_requests=150, priority_mix=(0.1, 0.4, 0.3, 0.2)), SimConfig(instances=4)),
        (dict(name="chatbot", num_requests=150), SimConfig(instances=8, macro_size=4, mode="ecoserve")),
    ],
    ids=["mooncake", "chatbot-classes", "ecoserve"],
)
def test_the_cluster_simulator_folds_without_changing_a_result(spec, cfg):
    one_by_one = _replay(spec, cfg, False)
    folded = _replay(spec, cfg, True)
    assert folded[:3] == one_by_one[:3]  # every token at the same time, every result, every instance's busy time
    assert folded[3] < one_by_one[3] / 2  # in fewer events: most steps were folded
