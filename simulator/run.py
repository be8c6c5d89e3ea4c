"""Run the simulator: `simulate` one policy, `compare` several on the same workload and fleet."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig, with_slos
from tokenyard.simulator.metrics import result, series


def simulate(
    workload,
    cfg: SimConfig,
    goodput_ms: dict[str, float] | None = None,
    chains: ChainCache | None = None,
    with_series: bool = False,
) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
    """Run `workload` (a block-id workload: name, block_tokens, items()) once under `cfg`;
    with_series: also the per-request TTFTs and per-instance batch-size samples (plots).
    The fleet runs to the goodput's TTFT/TPOT SLOs where `cfg` sets none (`with_slos`)."""
    items = workload.items()
    sim = ClusterSim(with_slos(cfg, goodput_ms), workload.block_tokens, chains)
    sim.run(items)
    res = result(sim, items, goodput_ms)
    return (res, series(sim)) if with_series else res


def compare_modes(
    workload,
    cfg: SimConfig,
    modes: list[str],
    goodput_ms: dict[str, float] | None = None,
    with_series: bool = False,
):
    """One result per macro-instance mode (and series if asked), each on the same requests,
    the same policy and a fresh fleet."""
    chains = ChainCache()
    runs = {m: simulate(workload, replace(cfg, mode=m), goodput_ms, chains, with_series) for m in modes}
    if not with_series:
        return runs
    return {m: r[0] for m, r in runs.items()}, {m: r[1] for m, r in runs.items()}


def compare(
    workload,
    cfg: SimConfig,
    policies: list[str],
    goodput_ms: dict[str, float] | None = None,
    with_series: bool = False,
):
    """One result per policy (and series if asked), each on the same requests and a fresh fleet."""
    chains = ChainCache()
    runs = {p: simulate(workload, replace(cfg, policy=p), goodput_ms, chains, with_series) for p in policies}
    if not with_series:
        return runs
    return {p: r[0] for p, r in runs.items()}, {p: r[1] for p, r in runs.items()}
