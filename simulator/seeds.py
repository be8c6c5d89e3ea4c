"""A comparison over several seeds (`tokenyard sim --compare A,B --seeds 101-112`): each seed is
one workload draw, the same for every policy, so the policies are compared pair by pair.

For each headline figure x (FIGURES) and policy p, over the n seeds s where x is finite:

    mean_p     = Σ_s x_p(s) / n
    d(s)       = x_p(s) − x_first(s)                 paired: the same requests on both sides
    diff       = Σ_s d(s) / n
    se         = sd(d) / √n,  sd with n − 1 (None for n < 2)
    better     = #{s : d(s) > 0} where higher is better (met SLO, goodput, req/s),
                 #{s : d(s) < 0} where lower is (refused, expired, latencies); worse alike

One run of a loaded, chaotic workload can move by more than the gap between two policies
(docs/results-routing.md, Round 21); the paired spread over seeds says how much of a gap is
the policy's. Pure: results in, numbers out; the runs are simulator/over_seeds.py's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    name: str
    """key in the summary (`met_slo`)"""
    label: str
    """column header (`met SLO`)"""
    path: str
    """dotted key in one run's result (`outcomes.all.met_slo`)"""
    fmt: str
    """format of a mean; a difference shows with a sign"""
    higher_is_better: bool


FIGURES = (
    Figure("met_slo", "met SLO", "outcomes.all.met_slo", "{:.1f}", True),
    Figure("refused", "refused", "outcomes.all.refused", "{:.1f}", False),
    Figure("expired", "expired", "outcomes.all.expired", "{:.1f}", False),
    Figure("request_goodput", "goodput", "request_goodput", "{:.2f}", True),
    Figure("mean_ttft_ms", "TTFT mean", "mean_ttft_ms", "{:.0f}", False),
    Figure("p99_ttft_ms", "TTFT p99", "p99_ttft_ms", "{:.0f}", False),
    Figure("p99_tpot_ms", "TPOT p99", "p99_tpot_ms", "{:.1f}", False),
    Figure("request_throughput", "req/s", "request_throughput", "{:.2f}", True),
)
"""The headline figures, in the tables' order; goodput only where `--goodput` set SLOs."""

MAX_SEEDS = 10_000


def parse_seeds(text: str) -> list[int]:
    """`101-112`, `1,2,3` or both (`1-3,7`) → the seeds in the order given; a clear ValueError
    for anything else (empty, a reversed range, a repeat, a negative seed)."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is neither a seed nor a range A-B (as in 101-112 or 1,2,3)") from None
        if first < 0 or last < first:
            raise ValueError(f"--seeds: {part!r} is not a range of seeds >= 0 (as in 101-112)")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise ValueError(f"--seeds: more than {MAX_SEEDS} seeds")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: a seed given twice in {text!r}")
    return seeds


def figures(goodput: bool) -> tuple[Figure, ...]:
    return tuple(f for f in FIGURES if goodput or f.name != "request_goodput")


def value(result: dict[str, Any], path: str) -> float | None:
    """The finite number at `path` in one run's result, else None."""
    v: Any = result
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def paired(diffs: list[float], higher_is_better: bool) -> dict[str, Any]:
    """Mean, standard error (sample sd / √n; None under two pairs), seeds better and worse."""
    n = len(diffs)
    mean = statistics.fmean(diffs) if n else None
    se = statistics.stdev(diffs) / math.sqrt(n) if n >= 2 else None
    sign = 1.0 if higher_is_better else -1.0
    return {
        "mean": mean,
        "se": se,
        "better": sum(1 for d in diffs if sign * d > 0),
        "worse": sum(1 for d in diffs if sign * d < 0),
        "n": n,
    }


def summarise(runs: list[dict[str, Any]], goodput: bool = False) -> dict[str, Any]:
    """`runs` = [{"seed": s, "policies": {name: result}}, …], every run with the same names in
    the same order, the first the baseline. Returns

        seeds     the seeds, in order
        baseline  the first name
        mean      {name: {figure: mean over the seeds where it is finite, or None}}
        paired    {name after the first: {figure: paired(d)}}: d over the seeds where both
                  values are finite
    """
    if not runs:
        raise ValueError("no runs to summarise")
    names = list(runs[0]["policies"])
    for run in runs:
        if list(run["policies"]) != names:
            raise ValueError(f"seed {run['seed']} ran {list(run['policies'])}, not {names}")
    figs = figures(goodput)
    mean: dict[str, dict[str, float | None]] = {}
    for name in names:
        mean[name] = {}
        for f in figs:
            xs = [x for run in runs if (x := value(run["policies"][name], f.path)) is not None]
            mean[name][f.name] = sum(xs) / len(xs) if xs else None
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names[1:]:
        pairs[name] = {}
        for f in figs:
            diffs = []
            for run in runs:
                x = value(run["policies"][name], f.path)
                b = value(run["policies"][names[0]], f.path)
                if x is not None and b is not None:
                    diffs.append(x - b)
            pairs[name][f.name] = paired(diffs, f.higher_is_better)
    return {"seeds": [run["seed"] for run in runs], "baseline": names[0], "mean": mean, "paired": pairs}
