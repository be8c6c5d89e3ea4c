"""A simulation's result: `vllm bench serve`'s keys computed by loadgen.metrics over the same
RequestRecord shape (send = arrival at admission, chunk times = the virtual times of output
tokens), plus tokenyard's own:

    prefix_hit_ratio    Σ cached prompt tokens / Σ prompt tokens, over completed requests
                        (the engine's num_cached_tokens at first schedule)
    prefix_hit_bound    the same for an infinite cache over this run's requests
                        (loadgen.workloads.prefix_hit_bound)
    load_balance        per-instance spread:
        prefill_tokens_cv / _max_over_mean   uncached prompt tokens each instance computed
        busy_s_cv                           seconds each instance spent stepping
        pbs_variance_mean                   mean over samples of Var_i(P_i × BS_i), P = queued
                                            prefill tokens, BS = running batch (seed 000's
                                            balance metric)
        batch_size_mean_max / _min / max_over_min   of the per-instance time-averaged batch size
    fleet_slo_ms        the TTFT/TPOT SLOs the fleet ran to (EcoServe's check, engines' slack)
    ecoserve_filter     decisions with EcoServe candidates, fallbacks (all refused: least
                        loaded took it), refusals by reason
    pd_handoffs         spatial P/D: requests whose KV went from a prefill to a decode worker
    outcomes            per class P0..P3 and in all: refused (by admission: 400 / 429 / 503; of
                        them refused_beyond_class, the 400s: a prompt whose own prefill does not fit
                        its class's deadline cap, shared.slo.deadline_cap_s),
                        expired (admitted, then rejected by the queue once its TTFT deadline
                        passed: 429), met_slo / missed_slo (completed with TTFT within / beyond
                        its own deadline, shared.slo.ttft_deadline_s: class target + its own
                        predicted prefill, capped; P3 has none: met), other failures,
                        max_ttft_over_target (the worst completed TTFT ÷ its class target) and
                        max_ttft_over_deadline (÷ its own deadline, from arrival)
    preemptions, sim_time_s, wall_s, sim_speed = sim_time_s / wall_s (the only keys that
    depend on the machine; everything else is bit-for-bit a function of the inputs)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenyard.loadgen.metrics import compute_metrics
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.workloads.blocks import TraceRequest, prefix_hit_bound
from tokenyard.shared.slo import NUM_CLASSES, klass, ttft_target_s
from tokenyard.simulator.cluster import ClusterSim

WALL_CLOCK_KEYS = ("wall_s", "sim_speed")


def records(sim: ClusterSim) -> list[RequestRecord]:
    out = []
    for st in sim.reqs.values():
        it = st.item
        rec = RequestRecord(index=it.index, priority=it.priority, prompt_len=it.prompt_len)
        rec.scheduled_s = rec.dispatched_s = rec.send_s = it.arrival_s
        rec.chunk_s = st.tokens  # an array('d'): indexable, as the metrics need
        rec.streamed_tokens = len(st.tokens)
        if st.error is not None:
            rec.fail(st.error, st.message)
        elif not st.finished:
            rec.fail("unfinished")
        rec.close(st.tokens[-1] if len(st.tokens) else it.arrival_s)
        out.append(rec)
    return out


def _cv(x: np.ndarray) -> float:
    m = float(x.mean()) if len(x) else 0.0
    return float(x.std() / m) if m > 0 else 0.0


def result(sim: ClusterSim, items: list[TraceRequest], goodput_ms: dict[str, float] | None) -> dict[str, Any]:
    recs = records(sim)
    start = items[0].arrival_s if items else 0.0
    end = max((r.end_s for r in recs if r.end_s is not None), default=start)
    out: dict[str, Any] = {"policy": sim.cfg.policy}
    out.update(compute_metrics(recs, end - start, goodput_ms or None))
    done = [st for st in sim.reqs.values() if st.finished and st.error is None]
    prompt = sum(st.item.prompt_len for st in done)
    out["prefix_hit_ratio"] = sum(st.cached_tokens for st in done) / prompt if prompt else 0.0
    out["prefix_hit_bound"] = prefix_hit_bound(items, sim.block_size)
    out["outcomes"] = outcomes(sim)
    out["load_balance"] = load_balance(sim)
    out["preemptions"] = sum(inst.engine.stats().preemptions for inst in sim.instances)
    ttft_ms, tpot_ms = sim.cfg.slos()
    out["fleet_slo_ms"] = {"ttft": ttft_ms, "tpot": tpot_ms}
    eco = sim.router.ecoserve
    out["ecoserve_filter"] = {"decisions": eco.decisions, "fallbacks": eco.fallbacks, "refused": dict(eco.refused or {})}
    out["pd_handoffs"] = sim.handoffs
    if sim.scaling_log:
        kinds = ("add", "remove", "started", "stopped", "grow", "split", "shrink", "merge")
        out["scaling"] = {k: sum(1 for e in sim.scaling_log if e[1] == k) for k in kinds}
        out["scaling"]["workers_max"] = max(s[1] for s in sim.fleet_samples)
        out["scaling"]["workers_min"] = min(s[1] for s in sim.fleet_samples)
    out["sim_time_s"] = sim.now
    out["wall_s"] = sim.wall_s
    out["sim_speed"] = sim.now / sim.wall_s if sim.wall_s > 0 else 0.0
    return out


def outcomes(sim: ClusterSim) -> dict[str, dict[str, float]]:
    keys = ("refused", "expired", "met_slo", "missed_slo", "failed_other")
    worst = {"max_ttft_over_target": 0.0, "max_ttft_over_deadline": 0.0}
    part = {"refused_beyond_class": 0}  # of `refused`, not beside it: the five keys above partition
    rows = {f"P{c}": dict.fromkeys(keys, 0) | part | worst for c in range(NUM_CLASSES)}
    for st in sim.reqs.values():
        c = klass(st.item.priority)
        row = rows[f"P{c}"]
        if st.expired:
            row["expired"] += 1
        elif st.error is not None and st.error.startswith("status_") and not st.worker:
            row["refused"] += 1
            row["refused_beyond_class"] += st.refused_code == "beyond_class_cap"
        elif st.finished and st.error is None and len(st.tokens):
            ttft = st.tokens[0] - st.item.arrival_s
            over = ttft / st.ttft_budget_s if st.ttft_budget_s > 0 else 0.0
            row["met_slo" if over <= 1.0 else "missed_slo"] += 1
            row["max_ttft_over_deadline"] = max(row["max_ttft_over_deadline"], over)
            row["max_ttft_over_target"] = max(row["max_ttft_over_target"], ttft / ttft_target_s(c))
        else:
            row["failed_other"] += 1
    total = {k: sum(r[k] for r in rows.values()) for k in (*keys, *part)}
    for k in worst:
        total[k] = max(r[k] for r in rows.values())
    return rows | {"all": total}


def load_balance(sim: ClusterSim) -> dict[str, Any]:
    stats = [inst.engine.stats() for inst in sim.instances]
    prefill = np.array([s.prefix_queries - s.prefix_hits for s in stats], dtype=float)
    busy = np.array([inst.busy_s for inst in sim.instances])
    bs = np.array([np.mean(inst.bs_samples) if len(inst.bs_samples) else 0.0 for inst in sim.instances])
    mean_prefill = float(prefill.mean()) if len(prefill) else 0.0
    return {
        "prefill_tokens_cv": _cv(prefill),
        "prefill_tokens_max_over_mean": float(prefill.max() / mean_prefill) if mean_prefill > 0 else 0.0,
        "busy_s_cv": _cv(busy),
        "pbs_variance_mean": float(np.mean(sim.pbs_var)) if sim.pbs_var else 0.0,
        "batch_size_mean_max": float(bs.max()) if len(bs) else 0.0,
        "batch_size_mean_min": float(bs.min()) if len(bs) else 0.0,
        "batch_size_max_over_min": float(bs.max() / bs.min()) if len(bs) and bs.min() > 0 else None,
    }


def series(sim: ClusterSim) -> dict[str, Any]:
    """Per-request TTFT (s) of completed requests and per-instance batch-size samples."""
    return {
        "ttft_s": [st.tokens[0] - st.item.arrival_s for st in sim.reqs.values() if st.finished and len(st.tokens)],
        "sample_s": list(sim.sample_times),
        "batch_size": {inst.id: list(inst.bs_samples) for inst in sim.instances},
    }
