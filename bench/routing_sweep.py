"""The routing evaluation of docs/results-routing.md: the router's default policy against the
peers (dynamo, llmd, llmd-token-load, sglang, least-loaded) and the seed's products, on 16 ×
a100-llama3-8b, at loads ×0.5 … ×3 of each workload's own rate, each point one `tokenyard
sim --compare` command; then the won/lost table.

    python -m bench.routing_sweep --traces DIR [--jobs 1] [--only mooncake-report,api]
                                  [--loads 0.5,1,2] [--requests 2000] [--out docs/results/routing]
    python -m bench.routing_sweep --table [--out docs/results/routing]   # tables only
    python -m bench.routing_sweep --goodput-detail [--out …]   # lost goodput: requests or span?
                                                                # and each cell under both definitions
    python -m bench.routing_sweep --out NEW --versus OLD   # the default of NEW against OLD's
    python -m bench.routing_sweep --goodput-miss [--loads 2,3]   # lost goodput: TTFT or TPOT misses?

Workloads, split into the ones the default was chosen on (tuned) and the ones it is judged
on (reported):
  tuned     mooncake-tune    Mooncake conversation trace, requests 0 … 2,999 (its first half
                             begins there)
            chatbot          seed 000's ChatBot, 3,000 requests
  reported  mooncake-report  the same trace, requests 6,016 … 9,015: its second half, unseen
            api              seed 000's API, 4,000 requests
            coder            seed 000's Coder, 2,000 requests
            azure-conv       Azure 2023 conversation trace with the seeded prefix model of
            azure-code       loadgen/workloads/azure_prefix.py (its code trace likewise),
                             first 3,000 requests each

A metric is won when, against the best peer in that cell (each metric's own best):
    mean TTFT ≤ 0.9 × the best peer's,   TPOT p99 ≤ the best peer's,
    prefix-hit ratio ≥ the best peer's − 0.01,   goodput ≥ the best peer's;
`ahead` marks a metric better than the best peer's but short of that margin; a cell (row) is
won when all four metrics are.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.data import TRACES
from tokenyard.services.router.core import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = DEFAULT_POLICY
PEERS = ("dynamo", "llmd", "llmd-token-load", "sglang", "least-loaded")

POLICIES = (DEFAULT, *PEERS, "multiplicative")
LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)
GOODPUT = ("ttft:2000", "tpot:100")
MOONCAKE = "mooncake_conversation_trace.jsonl"
WORKLOADS: dict[str, tuple[str, int, int, str]] = {
    # name → (--workload, --num-requests, --skip-requests, tuned | reported)
    "mooncake-tune": ("trace:{traces}/" + MOONCAKE, 3000, 0, "tuned"),
    "chatbot": ("chatbot", 3000, 0, "tuned"),
    "mooncake-report": ("trace:{traces}/" + MOONCAKE, 3000, 6016, "reported"),
    "api": ("api", 4000, 0, "reported"),
    "coder": ("coder", 2000, 0, "reported"),
    "azure-conv": ("azure-conv-prefix", 3000, 0, "reported"),
    "azure-code": ("azure-code-prefix", 3000, 0, "reported"),
}
METRICS = (  # (key, label, better, the winning test against the best peer, format)
    ("mean_ttft_ms", "TTFT mean (ms)", min, lambda d, b: d <= 0.9 * b, "{:.0f}"),
    ("p99_tpot_ms", "TPOT p99 (ms)", min, lambda d, b: d <= b, "{:.1f}"),
    ("prefix_hit_ratio", "hit", max, lambda d, b: d >= b - 0.01, "{:.3f}"),
    ("request_goodput", "goodput (req/s)", max, lambda d, b: d >= b, "{:.2f}"),
)


def trace_dir_spec(spec: str, traces: str) -> str:
    """`spec` with its trace folder filled in; the bundled traces are gzipped (.jsonl.gz)."""
    path = spec.format(traces=traces)
    if path.startswith("trace:") and not Path(path[6:]).exists() and Path(path[6:] + ".gz").exists():
        path += ".gz"
    return path


def command(
    name: str, load: float, out: Path, traces: str, requests: int | None = None, policies: tuple[str, ...] = POLICIES
) -> list[str]:
    """One point's `tokenyard sim --compare`; `requests` overrides the workload's count."""
    spec, n, skip, _ = WORKLOADS[name]
    n = requests or n
    return [
        "tokenyard", "sim", "--workload", trace_dir_spec(spec, traces), "--num-requests", str(n),
        *(["--skip-requests", str(skip)] if skip else []), "--instances", "16", "--profile", "a100-llama3-8b",
        "--compare", ",".join(policies), "--rate-scale", f"{load:g}", "--goodput", *GOODPUT, "--seed", "0",
        "--quiet", "--json", str(out / f"{name}_x{load:g}.json"),
    ]  # fmt: skip


def scrub(text: str, traces: str) -> str:
    """`text` without this machine's paths: the trace folder reads TRACES and the checkout's
    own prefix is dropped, so a committed result names no path outside the repository."""
    return (text.replace(traces, "TRACES") if traces else text).replace(str(ROOT) + "/", "")


def run_point(
    name: str, load: float, out: Path, traces: str, requests: int | None = None, policies: tuple[str, ...] = POLICIES
) -> tuple[str, float, float, int]:
    """Run one point. With a subset of the policies, their results join those already in the
    point's JSON (same workload, load and request count; each command is kept under
    `commands`), so the default can be rerun without rerunning the peers."""
    path = out / f"{name}_x{load:g}.json"
    before = json.loads(path.read_text()) if path.exists() else None
    cmd = command(name, load, out, traces, requests, policies)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tokenyard.cli", *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode == 0:
        doc = json.loads(path.read_text())
        line = scrub(shlex.join(cmd), traces)
        doc = json.loads(scrub(json.dumps(doc), traces))
        doc["command"] = line
        doc["commands"] = {p: line for p in doc["policies"]}
        if before is not None and set(policies) != set(POLICIES):
            if before["config"].get("num_requests") != doc["config"].get("num_requests"):
                raise SystemExit(f"{path}: holds a run of another request count; use another --out")
            kept = {p: r for p, r in before["policies"].items() if p not in doc["policies"]}
            commands = {p: c for p, c in before.get("commands", {}).items() if p in kept}
            commands |= {p: before["command"] for p in kept if p not in commands}
            doc["policies"] = kept | doc["policies"]
            doc["commands"] = commands | doc["commands"]
        path.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        print(proc.stderr, file=sys.stderr)
    return name, load, wall, proc.returncode


def cell(res: dict[str, dict], key: str, better, wins) -> tuple[str, float, float, str]:
    """(verdict, default's value, best peer's value, best peer's name) for one metric; the
    verdict is `won`, `ahead` (better than the best peer, short of the margin) or `lost`."""
    peers = {p: res[p][key] for p in PEERS if p in res}
    best = better(peers, key=peers.get)
    mine = res[DEFAULT][key]
    if wins(mine, peers[best]):
        return "won", mine, peers[best], best
    ahead = mine < peers[best] if better is min else mine > peers[best]
    return ("ahead" if ahead else "lost"), mine, peers[best], best


def tables(out: Path) -> str:
    lines = []
    for kind in ("reported", "tuned"):
        names = [n for n, w in WORKLOADS.items() if w[3] == kind and any(out.glob(f"{n}_x*.json"))]
        if not names:
            lines += [f"### {kind.capitalize()} workloads", "", "No point run.", ""]
            continue
        lines += [f"### {kind.capitalize()} workloads", "",
                  "| workload | load | " + " | ".join(m[1] for m in METRICS) + " | failed | cell |",
                  "|---|---|" + "---|" * (len(METRICS) + 2)]
        for name in names:
            for load in LOADS:
                path = out / f"{name}_x{load:g}.json"
                if not path.exists():
                    lines.append(f"| {name} | ×{load:g} | " + " | ".join("not run" for _ in METRICS) + " | | — |")
                    continue
                res = json.loads(path.read_text())["policies"]
                missing = "default" if DEFAULT not in res else "peers" if not set(PEERS) & set(res) else ""
                if missing:
                    lines.append(f"| {name} | ×{load:g} | " + " | ".join(f"{missing} not run" for _ in METRICS) + " | | — |")
                    continue
                parts, all_won = [], True
                for key, _, better, wins, fmt in METRICS:
                    verdict, mine, best, who = cell(res, key, better, wins)
                    all_won &= verdict == "won"
                    mark = {"won": "**won**", "ahead": "ahead", "lost": "lost"}[verdict]
                    parts.append(f"{mark} {fmt.format(mine)} vs {fmt.format(best)} ({who})")
                # requests that never completed (deadline, refusal): the metrics above are over
                # the completed ones, so a policy that fails more is flattered by them
                fewest = min((p for p in PEERS if p in res), key=lambda p: res[p]["failed"])
                parts.append(f"{res[DEFAULT]['failed']} vs {res[fewest]['failed']} ({fewest})")
                lines.append(f"| {name} | ×{load:g} | " + " | ".join(parts) + f" | {'**won**' if all_won else 'lost'} |")
        lines.append("")
    return "\n".join(lines)


def reported_cells(out: Path) -> Iterator[tuple[str, float, dict]]:
    """(workload, load, the policies' results) for each reported cell swept into `out` that holds
    the default and at least one peer."""
    for name in (n for n, w in WORKLOADS.items() if w[3] == "reported"):
        for load in LOADS:
            path = out / f"{name}_x{load:g}.json"
            if not path.exists():
                continue
            res = json.loads(path.read_text())["policies"]
            if DEFAULT in res and set(PEERS) & set(res):
                yield name, load, res


def goodput_detail(out: Path) -> str:
    """For each reported cell whose goodput the default loses: whether it lost requests (met
    the SLO fewer times, or was refused more: admission's refusals and the queue's expiries)
    or only time (goodput = requests within the SLO ÷ the run's span, first arrival to last
    completion, so a later last completion lowers it with every request served)."""
    lines = ["| workload | load | best peer | met SLO | refused + expired | span (s) | goodput (req/s) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for name, load, res in reported_cells(out):
        verdict, _, _, who = cell(res, "request_goodput", max, lambda d, b: d >= b)
        if verdict == "won":
            continue
        mine, peer = res[DEFAULT], res[who]

        def pair(f, mine=mine, peer=peer) -> str:
            return f"{f(mine)} vs {f(peer)}"

        lines.append(
            f"| {name} | ×{load:g} | {who} | {pair(lambda r: r['outcomes']['all']['met_slo'])} | "
            f"{pair(lambda r: r['outcomes']['all']['refused'] + r['outcomes']['all']['expired'])} | "
            f"{pair(lambda r: format(r['duration'], '.2f'))} | {pair(lambda r: format(r['request_goodput'], '.3f'))} |")
    return "\n".join(lines)


def versus(out: Path, before: Path) -> str:
    """The default of `out` against the default of `before` (same points, the same peers): the
    won count per metric in each, the geomean of the default's value (out ÷ before) per metric,
    and every cell whose verdict changed."""
    import math

    counts = {key: [0, 0] for key, *_ in METRICS}
    logs = {key: [] for key, *_ in METRICS}
    rows, changed = 0, []
    for name in (n for n, w in WORKLOADS.items() if w[3] == "reported"):
        for load in LOADS:
            a, b = out / f"{name}_x{load:g}.json", before / f"{name}_x{load:g}.json"
            if not (a.exists() and b.exists()):
                continue
            ra, rb = (json.loads(x.read_text())["policies"] for x in (a, b))
            if DEFAULT not in ra or DEFAULT not in rb:
                continue
            rows += 1
            for key, label, better, wins, fmt in METRICS:
                va, vb = cell(ra, key, better, wins), cell(rb, key, better, wins)
                counts[key][0] += vb[0] == "won"
                counts[key][1] += va[0] == "won"
                if vb[1] > 0 and va[1] > 0:
                    logs[key].append(math.log(va[1] / vb[1]))
                if va[0] != vb[0]:
                    changed.append(f"* {label}: {name} ×{load:g} {vb[0]} → {va[0]} "
                                   f"({fmt.format(vb[1])} → {fmt.format(va[1])} against {va[3]}'s {fmt.format(va[2])})")
    lines = [f"| metric | won, {before} | won, {out} | geomean of the default's value, after ÷ before |",
             "|---|---:|---:|---:|"]
    for key, label, better, *_ in METRICS:
        g = math.exp(sum(logs[key]) / len(logs[key])) - 1.0 if logs[key] else float("nan")
        worse = (g > 0) if better is min else (g < 0)
        lines.append(f"| {label} | {counts[key][0]} | {counts[key][1]} | {g:+.2%}{' (worse)' if worse and g != 0 else ''} |")
    return "\n".join([*lines, "", f"{rows} rows; cells that changed verdict:", *changed])


def goodput_miss(out: Path, traces: str, loads: set[float]) -> str:
    """For each reported cell at `loads` whose goodput the default loses: the default and that
    cell's best peer rerun in this process (the simulator is deterministic: the same numbers as
    the JSONs), their completed requests split by which of the goodput's SLOs each missed —
    TTFT > 2 s (queueing), TPOT > 100 ms (decode), both — beside the requests that never
    completed and the run's span."""
    from tokenyard.loadgen.workloads import open_workload
    from tokenyard.simulator.cluster import ClusterSim, SimConfig, with_slos
    from tokenyard.simulator.metrics import records

    slo = {k: float(v) for k, v in (g.split(":") for g in GOODPUT)}
    lines = ["| workload | load | policy | good | missed TTFT only | missed TPOT only | missed both | not completed | span (s) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, load, res in reported_cells(out):
        verdict, _, _, who = cell(res, "request_goodput", max, lambda d, b: d >= b)
        if verdict == "won" or load not in loads:
            continue
        spec, _, skip, _ = WORKLOADS[name]
        n = json.loads((out / f"{name}_x{load:g}.json").read_text())["config"]["num_requests"]
        w = open_workload(trace_dir_spec(spec, traces), num_requests=n, rate_scale=load, seed=0, skip_requests=skip)
        for policy in (DEFAULT, who):
            cfg = SimConfig(instances=16, profile="a100-llama3-8b", policy=policy, seed=0)
            sim = ClusterSim(with_slos(cfg, slo), w.block_tokens)
            sim.run(w.items())
            recs = records(sim)
            ok = [r for r in recs if r.success]
            late = [(r.ttft * 1000 > slo["ttft"], (r.tpot or 0.0) * 1000 > slo["tpot"]) for r in ok]
            start = w.items()[0].arrival_s
            span = max(r.end_s for r in recs if r.end_s is not None) - start
            lines.append(f"| {name} | ×{load:g} | {policy} | {late.count((False, False))} | {late.count((True, False))} | "
                         f"{late.count((False, True))} | {late.count((True, True))} | {len(recs) - len(ok)} | {span:.2f} |")
    return "\n".join(lines)


def attainment(r: dict) -> float:
    """SLO attainment: the requests that met the SLO ÷ the requests sent (refused, expired and
    failed ones count as missed) — DistServe's per-rate quantity (its goodput is the highest
    rate at which attainment stays ≥ 90 %), independent of when the run's last request ends."""
    o = r["outcomes"]["all"]
    sent = sum(o[k] for k in ("refused", "expired", "met_slo", "missed_slo", "failed_other"))
    return o["met_slo"] / sent if sent else 0.0


def goodput_definitions(out: Path) -> str:
    """Every reported cell's goodput verdict under two definitions, side by side: the figure's
    (vLLM benchmark_serving's `--goodput`: requests within the SLO ÷ the run's duration, first
    send to last completion) and SLO attainment (attainment() above). Where they disagree the
    definition decides the cell."""
    lines = ["| workload | load | goodput (req/s), default vs best peer | verdict | attainment, default vs best peer | verdict |",
             "|---|---|---|---|---|---|"]
    count = {"span": 0, "attain": 0, "cells": 0, "differ": 0}
    for name, load, res in reported_cells(out):
        g, mine_g, best_g, who_g = cell(res, "request_goodput", max, lambda d, b: d >= b)
        peers = {p: attainment(res[p]) for p in PEERS if p in res}
        who_a = max(peers, key=peers.get)
        mine_a = attainment(res[DEFAULT])
        a = "won" if mine_a >= peers[who_a] else "lost"
        g = "won" if g == "won" else "lost"
        count["cells"] += 1
        count["span"] += g == "won"
        count["attain"] += a == "won"
        count["differ"] += g != a
        mark = {"won": "**won**", "lost": "lost"}
        lines.append(f"| {name} | ×{load:g} | {mine_g:.3f} vs {best_g:.3f} ({who_g}) | {mark[g]} | "
                     f"{mine_a:.3f} vs {peers[who_a]:.3f} ({who_a}) | {mark[a]} |")
    lines += ["", f"won: {count['span']} of {count['cells']} by requests ÷ span (the figure's), "
              f"{count['attain']} by SLO attainment; the definition decides {count['differ']} cells"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(TRACES),
                    help="folder holding mooncake_conversation_trace.jsonl[.gz] (default: the bundled traces)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "routing"),
                    help="folder of the points' JSONs: the runs write there, the tables read it "
                         "(default: docs/results/routing in this repository)")
    ap.add_argument("--jobs", type=int, default=1, help="points run at once (default 1)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"workloads (default: all: {','.join(WORKLOADS)})")
    ap.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS),
                    help="loads, each a multiplier of the workload's own arrival rate, comma list (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per point for every workload (default: each workload's own count above)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="policies to run at each point, joining those already in its JSON (default: all)")
    ap.add_argument("--table", action="store_true", help="print the tables of existing results only")
    ap.add_argument("--goodput-detail", action="store_true",
                    help="print, for each reported cell whose goodput the default loses, its requests and span against the best peer's")
    ap.add_argument("--goodput-miss", action="store_true",
                    help="for each reported cell at --loads whose goodput the default loses: its and the best peer's "
                         "requests by the SLO they missed (TTFT, TPOT), rerun in this process")
    ap.add_argument("--versus", metavar="DIR",
                    help="compare the default in --out with the default in DIR (won counts, geomeans, changed cells)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.versus:
        print(versus(out, Path(args.versus)))
        return 0
    if args.goodput_miss:
        print(goodput_miss(out, args.traces, {float(x) for x in args.loads.split(",")}))
        return 0
    if args.goodput_detail:
        print(goodput_detail(out))
        print()
        print(goodput_definitions(out))
        return 0
    if not args.table:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in names if n not in WORKLOADS]
        if bad:
            ap.error(f"unknown workload(s) {bad}; known: {', '.join(WORKLOADS)}")
        if any(WORKLOADS[n][0].startswith("trace:") for n in names) and not args.traces:
            ap.error("--traces DIR is needed for the Mooncake points")
        out.mkdir(parents=True, exist_ok=True)
        points = [(n, float(x)) for n in names for x in args.loads.split(",")]
        policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        with ThreadPoolExecutor(args.jobs) as pool:
            for name, load, wall, rc in pool.map(
                lambda p: run_point(*p, out, args.traces or "", args.requests, policies), points
            ):
                print(f"{name} ×{load:g}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {wall:.0f} s", flush=True)
    print(tables(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
