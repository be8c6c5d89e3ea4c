"""The router's EcoServe filter on constructed fleets: only prefill-phase workers that pass the
constraint check get new requests; the session's worker (longest cached prefix) first; the
least loaded when none passes; workers outside EcoServe untouched."""

from __future__ import annotations

import numpy as np
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.shared.schemas import Heartbeat, MacroState

from tests.builders import hb, req


def eco_state(workers, accepting, mid="m0", ttft=1000.0) -> MacroState:
    phases = {w: "prefill" if w in accepting else "decode" for w in workers}
    return MacroState(mid, "ecoserve", workers, phases, accepting, 1, 0.0, ttft, 50.0)


def router(*beats: Heartbeat, states=()) -> RouterCore:
    r = RouterCore(RouterConfig(policy="least-loaded"))
    for b in beats:
        r.on_heartbeat(b, 0.0)
    for s in states:
        r.on_macro_state(s)
    return r


def test_new_requests_go_only_to_prefill_phase_workers():
    r = router(hb("a", prefill_ms_per_token=0.1, macro_id="m0"), hb("b", prefill_ms_per_token=0.1, macro_id="m0"), hb("c", prefill_ms_per_token=0.1, macro_id="m0"), states=[eco_state(["a", "b", "c"], ["b"])])
    assert [r.route(req(prompt_len=1000, max_tokens=16), 0.0).worker_id for _ in range(3)] == ["b", "b", "b"]


def test_each_refusal_moves_the_request_to_a_worker_that_passes():
    # a: 0.1 × (9500 + 1000) = 1050 ms > 1000 (TTFT); b: slack 50 < 100 ms (TPOT); c: 10 free
    # blocks < 64 (memory); d passes although it is the most loaded.
    beats = [hb("a", queued=9500, prefill_ms_per_token=0.1, macro_id="m0"), hb("b", tpot_slack_ms=50.0, prefill_ms_per_token=0.1, macro_id="m0"), hb("c", free=10, prefill_ms_per_token=0.1, macro_id="m0"), hb("d", running=9, tpot_slack_ms=500.0, prefill_ms_per_token=0.1, macro_id="m0")]
    r = router(*beats, states=[eco_state(["a", "b", "c", "d"], ["a", "b", "c", "d"])])
    assert r.route(req(prompt_len=1000, max_tokens=16), 0.0).worker_id == "d"
    assert r.ecoserve.refused == {"ttft": 1, "tpot": 1, "memory": 1}


def test_none_passes_the_least_loaded_prefill_worker_takes_it():
    beats = [hb("a", queued=20_000, running=3, prefill_ms_per_token=0.1, macro_id="m0"), hb("b", queued=20_000, running=1, waiting=1, prefill_ms_per_token=0.1, macro_id="m0"), hb("c", running=0, prefill_ms_per_token=0.1, macro_id="m0")]
    r = router(*beats, states=[eco_state(["a", "b", "c"], ["a", "b"])])
    assert r.route(req(prompt_len=1000, max_tokens=16), 0.0).worker_id == "b"  # c is in its decode phase
    assert (r.ecoserve.decisions, r.ecoserve.fallbacks) == (1, 1)


def test_a_worker_whose_decode_just_made_its_first_token_takes_a_short_prefill():
    """Issue 13, fix 3: the engine reports a fresh decode's slack as a whole TPOT SLO (50 ms
    here), which covers 0.1 × 400 = 40 ms of prefill; it used to report 0, every such worker
    refused (TPOT) and the filter fell back to the least loaded."""
    from tokenyard.services.worker.engine import EngineOutput
    from tokenyard.services.worker.sim.slack import SlackClock

    clock = SlackClock(default_tpot_slo_ms=50.0)
    clock.on_step(0.2, [EngineOutput("d", [7], False, None)], lambda rid: 0.0)
    beats = [hb("a", tpot_slack_ms=clock.min_slack_ms(), running=1, prefill_ms_per_token=0.1, macro_id="m0"), hb("b", queued=20_000, prefill_ms_per_token=0.1, macro_id="m0")]
    r = router(*beats, states=[eco_state(["a", "b"], ["a", "b"])])
    assert r.route(req(prompt_len=400, max_tokens=16), 0.0).worker_id == "a"
    assert r.ecoserve.refused == {"ttft": 1}
    assert (r.ecoserve.decisions, r.ecoserve.fallbacks) == (1, 0)


def test_the_session_worker_holding_the_prefix_is_preferred():
    r = router(hb("a", prefill_ms_per_token=0.1, macro_id="m0"), hb("b", prefill_ms_per_token=0.1, macro_id="m0"), hb("c", running=5, prefill_ms_per_token=0.1, macro_id="m0"), states=[eco_state(["a", "b", "c"], ["a", "b", "c"])])
    chain = [11, 12, 13]
    from tokenyard.shared.schemas import BlockStored, KVEventBatch

    r.on_kv_events("c", KVEventBatch(0.0, [BlockStored(chain, None, list(range(48)), 16)]), 0.0)
    assert r.route(req(prompt_len=100, chain=chain, max_tokens=16), 0.0).worker_id == "c"  # least-loaded alone would pick a


def test_workers_outside_ecoserve_are_untouched():
    beats = [hb("a", queued=20_000, macro_id="m0", prefill_ms_per_token=0.1), hb("x", queued=20_000, macro_id="m1", prefill_ms_per_token=0.1)]
    r = router(*beats, states=[eco_state(["a"], ["a"]),
                               MacroState("m1", "nodg", ["x"], {"x": "mixed"}, ["x"], 1, 0.0)])
    keep, _ = r.ecoserve.narrow(req(prompt_len=1000, max_tokens=16), r.view, np.array([0, 1]))
    assert keep.tolist() == [True, True]  # a: none passes → least loaded (itself); x: not EcoServe
    assert r.ecoserve.refused == {"ttft": 1}
