"""Metrics of every service (shared/metrics.py): exact values from hand-made inputs, the
macro-instance bookkeeping as a property, and a live in-process fleet whose counters must
agree with what the client saw, over `/metrics` and over `$SRV.STATS`."""

from __future__ import annotations

import json

import aiohttp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from tokenyard.shared import codec, metrics, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests import builders
from tests.conftest import until


def hb(**kw) -> schemas.Heartbeat:
    base = dict(running=3, waiting=2, queued=700, used=25, free=75, prefix_hits=480, prefix_queries=1600,
                preemptions=4, phase=schemas.Phase.DECODE, macro_id="m0", step_time_ms=12.5)
    return builders.hb("w0", **{**base, **kw})


def test_worker_gauges_use_vllm_names_and_read_the_last_heartbeat():
    m = metrics.WorkerMetrics("w0", "m")
    assert b"vllm:num_requests_running" not in generate_latest(m.registry)  # nothing before a heartbeat
    m.heartbeat = hb()
    get = m.registry.get_sample_value
    labels = {"model_name": "m", "worker_id": "w0"}
    assert get("vllm:num_requests_running", labels) == 3
    assert get("vllm:num_requests_waiting", labels) == 2
    assert get("vllm:gpu_cache_usage_perc", labels) == 0.25
    assert get("vllm:kv_cache_usage_perc", labels) == 0.25
    assert get("vllm:num_preemptions_total", labels) == 4
    assert get("vllm:prefix_cache_queries_total", labels) == 1600
    assert get("vllm:prefix_cache_hits_total", labels) == 480
    assert get("tokenyard:worker_queued_prefill_tokens", labels) == 700
    assert get("tokenyard:worker_step_time_seconds", labels) == 0.0125
    assert get("tokenyard:worker_phase", {**labels, "phase": "decode", "macro_id": "m0"}) == 1
    assert get("tokenyard:worker_phase", {**labels, "phase": "prefill", "macro_id": "m0"}) == 0
    m.heartbeat = hb(running=0, preemptions=9)  # the next scrape sees the next heartbeat
    assert get("vllm:num_requests_running", labels) == 0
    assert get("vllm:num_preemptions_total", labels) == 9


def test_worker_request_histograms():
    m = metrics.WorkerMetrics("w0", "m")
    m.observe_finished(ttft_s=0.2, e2e_s=1.2, prompt_tokens=100, output_tokens=11, finish_reason="length")
    m.observe_finished(ttft_s=None, e2e_s=0.5, prompt_tokens=7, output_tokens=0, finish_reason="abort")
    get = m.registry.get_sample_value
    labels = {"model_name": "m", "worker_id": "w0"}
    assert get("vllm:time_to_first_token_seconds_count", labels) == 1
    assert get("vllm:time_to_first_token_seconds_sum", labels) == 0.2
    assert abs(get("vllm:time_per_output_token_seconds_sum", labels) - 0.1) < 1e-12  # (1.2 - 0.2) / 10
    assert get("vllm:e2e_request_latency_seconds_count", labels) == 2
    assert get("vllm:prompt_tokens_total", labels) == 107
    assert get("vllm:generation_tokens_total", labels) == 11
    assert get("vllm:request_success_total", {**labels, "finished_reason": "length"}) == 1
    assert get("vllm:request_success_total", {**labels, "finished_reason": "abort"}) == 1


def test_queue_depth_is_read_at_scrape_time_and_wait_counts_only_routed():
    depth = [[1, 0, 4, 0]]
    m = metrics.QueueMetrics(lambda: schemas.QueueStats("q", 0.0, "fcfs", depth[0], [10, 0, 40, 0], in_flight=2))
    get = m.registry.get_sample_value
    assert [get("tokenyard:queue_depth", {"priority": p}) for p in metrics.PRIORITIES] == [1, 0, 4, 0]
    assert get("tokenyard:queue_in_flight") == 2
    depth[0] = [0, 0, 0, 9]
    assert get("tokenyard:queue_depth", {"priority": "P3"}) == 9
    m.observe_dispatch(schemas.Outcome.ROUTED, 1, 0.3)
    m.observe_dispatch(schemas.Outcome.NO_CAPACITY, 1, 0.5)
    assert get("tokenyard:queue_wait_seconds_count", {"priority": "P1"}) == 1
    assert get("tokenyard:queue_wait_seconds_sum", {"priority": "P1"}) == 0.3
    assert m.snapshot() == {"depth": {"P0": 0, "P1": 0, "P2": 0, "P3": 9},
                            "dispatches": {"routed": 1.0, "no_capacity": 1.0}}


def test_router_decisions_hit_ratio_and_pxbs_spread():
    m = metrics.RouterMetrics("multiplicative")
    m.observe(schemas.Outcome.ROUTED, 0.002, hit_tokens=48, prompt_len=64)
    m.observe(schemas.Outcome.NO_CAPACITY, 0.004, hit_tokens=None, prompt_len=64)
    m.observe_fleet(np.array([100.0, 0.0, 50.0]), np.array([2, 5, 1]))
    get = m.registry.get_sample_value
    assert get("tokenyard:router_decisions_total", {"policy": "multiplicative", "outcome": "routed"}) == 1
    assert get("tokenyard:router_decisions_total", {"policy": "multiplicative", "outcome": "no_capacity"}) == 1
    assert get("tokenyard:router_prefix_hit_ratio_sum") == 0.75
    assert get("tokenyard:router_prefix_hit_ratio_count") == 1
    assert get("tokenyard:router_decision_seconds_count") == 2
    assert get("tokenyard:router_pxbs_spread") == 200.0  # P×BS = 200, 0, 50
    m.observe_fleet(np.array([]), np.array([]))
    assert m.snapshot()["pxbs_spread"] == 0.0


def test_router_pxbs_spread_is_read_from_the_fleet_when_scraped():
    """The router's gauge reads the fleet's rows at scrape time: no decision pays for it."""
    rows = {"p": np.array([100.0, 0.0]), "bs": np.array([2, 5])}
    m = metrics.RouterMetrics("marginal-latency", fleet=lambda: (rows["p"], rows["bs"]))
    get = m.registry.get_sample_value
    assert get("tokenyard:router_pxbs_spread") == 200.0
    rows.update(p=np.array([10.0, 30.0, 5.0]), bs=np.array([1, 3, 2]))  # a heartbeat later
    assert get("tokenyard:router_pxbs_spread") == 80.0  # P×BS = 10, 90, 10
    rows.update(p=np.array([]), bs=np.array([]))
    assert m.snapshot()["pxbs_spread"] == 0.0


def test_admission_counts_refusals_by_reason():
    m = metrics.AdmissionMetrics()
    m.observe(schemas.Outcome.ADMITTED)
    m.observe(schemas.Outcome.REJECTED_RATE, "rate_limit_exceeded")
    m.observe(schemas.Outcome.REJECTED_RATE, "rate_limit_exceeded")
    assert m.snapshot() == {"decisions": {"admitted": 1.0, "rejected_rate": 2.0},
                            "refusals": {"rate_limit_exceeded": 2.0}}


def state(macro: str, phases: dict[str, str], epoch: int = 0) -> schemas.MacroState:
    return schemas.MacroState(macro, "ecoserve", sorted(phases), phases, sorted(phases), epoch, 0.0)


def test_macro_phases_migrations_and_switches():
    m = metrics.MacroMetrics()
    m.observe_states([state("m0", {"a": "prefill", "b": "decode"}), state("m1", {"c": "decode"})])
    m.observe_states([state("m0", {"a": "decode"}), state("m1", {"b": "decode", "c": "decode"})])
    get = m.registry.get_sample_value
    assert get("tokenyard:macro_workers", {"macro_id": "m0", "phase": "decode"}) == 1
    assert get("tokenyard:macro_workers", {"macro_id": "m0", "phase": "prefill"}) == 0
    assert get("tokenyard:macro_workers", {"macro_id": "m1", "phase": "decode"}) == 2
    assert m.snapshot() == {"migrations": 1.0, "phase_switches": 1.0}  # b moved m0 → m1; a prefill → decode


@given(st.lists(st.tuples(st.sampled_from(["m0", "m1", "m2"]),
                          st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["mixed", "prefill", "decode"]),
                                          max_size=4)), max_size=30))
def test_macro_gauges_match_the_last_state_and_moves_are_counted_once(states):
    m = metrics.MacroMetrics()
    home: dict[str, str] = {}
    moves = 0
    last: dict[str, dict[str, str]] = {}
    for macro, phases in states:
        m.observe_states([state(macro, phases)])
        last[macro] = phases
        for w in phases:
            moves += home.get(w, macro) != macro
            home[w] = macro
    assert m.snapshot()["migrations"] == moves
    for macro, phases in last.items():
        for p in ("mixed", "prefill", "decode"):
            want = sum(1 for v in phases.values() if v == p)
            assert m.registry.get_sample_value("tokenyard:macro_workers", {"macro_id": macro, "phase": p}) == want


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return await r.text()


def sample(text: str, line_start: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


async def test_live_fleet_counters_agree_with_the_client(fleet):
    by_kind = {host.shell.kind: host for host in fleet.hosts}
    runners = {kind: await metrics.serve(h.shell.metrics.registry, 0, "127.0.0.1") for kind, h in by_kind.items()}
    try:
        client = TokenyardClient(fleet.nats)
        for i in range(6):
            done = await client.generate(schemas.GenerateRequest(prompt=f"metrics {i}", max_tokens=3,
                                                                 priority=2 + i % 2))
            assert done.finish_reason == "length"
        inbox = fleet.nats.new_inbox()
        sub = await fleet.nats.subscribe(inbox)
        await fleet.nats.publish(subjects.SUBMIT, codec.encode(schemas.GenerateRequest(prompt="x", max_tokens=-1)),
                                 reply=inbox)
        assert isinstance(codec.decode_event((await sub.next_msg(timeout=5)).data), schemas.Rejected)
        # The client has its last token before the queue and the router have counted their
        # answer (the worker streams straight to the client): await their counters, and the
        # workers' next heartbeats (every 0.1 s) for their running count.
        async def settled() -> dict[str, str] | None:
            text = {k: await scrape(f"http://127.0.0.1:{metrics.bound_port(r)}/metrics") for k, r in runners.items()}
            done = (sample(text["queue"], 'tokenyard:queue_dispatches_total{outcome="routed"}') == 6
                    and sample(text["router"], "tokenyard:router_decisions_total{") == 6
                    and sample(text["worker"], "vllm:num_requests_running{") == 0)
            return text if done else None

        text = await until(settled, poll_s=0.05)
        assert sample(text["admission"], 'tokenyard:admission_decisions_total{outcome="admitted"}') == 6
        assert sample(text["admission"], 'tokenyard:refusals_total{reason="invalid_value"}') == 1
        assert sample(text["queue"], 'tokenyard:queue_dispatches_total{outcome="routed"}') == 6
        assert sample(text["queue"], 'tokenyard:queue_wait_seconds_count{priority="P2"}') == 3
        assert sample(text["queue"], 'tokenyard:queue_wait_seconds_count{priority="P3"}') == 3
        assert sample(text["queue"], "tokenyard:queue_depth{") == 0
        assert sample(text["router"], 'tokenyard:router_decisions_total{outcome="routed",policy="least-loaded"}') == 6
        assert sample(text["router"], "tokenyard:router_prefix_hit_ratio_count") == 6
        worker_text = text["worker"]  # the first worker host registered: tw0
        finished = sum(w.shell.metrics.registry.get_sample_value(
            "vllm:request_success_total", {"model_name": "tokenyard-sim", "worker_id": w.shell.instance_id,
                                           "finished_reason": "length"}) or 0 for w in fleet.workers)
        assert finished == 6
        assert sample(worker_text, "vllm:num_requests_running{") == 0
        assert "vllm:gpu_cache_usage_perc{" in worker_text

        # The same counters through nats.micro's $SRV.STATS, which is what `tokenyard top` reads.
        reply = await fleet.nats.request("$SRV.STATS.tokenyard-admission", b"", timeout=2)
        data = json.loads(reply.data)["endpoints"][0]["data"]
        assert data == {"decisions": {"admitted": 6.0, "rejected_invalid": 1.0}, "refusals": {"invalid_value": 1.0},
                        # what it holds per request (0: all handed on), and its tenant buckets (no rate: none)
                        "kept": {"handing": 0, "inflight": 0}, "remembered": {"tenant_buckets": [0, None]}}
    finally:
        for r in runners.values():
            await r.cleanup()
