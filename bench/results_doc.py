"""Tables of docs/RESULTS.md from the JSONs bench/run_results.py wrote.

    python -m bench.results_doc [--results docs/results] [--doc docs/RESULTS.md]

Replaces what lies between `<!-- tables:begin -->` and `<!-- tables:end -->` in the document
(the prose around them is written by hand) with, per workload:
  * seed 000's table shape at every load: TTFT mean, TPOT p99, KV$ hit ratio (next to the
    infinite-cache bound), plus TTFT p50 and p99, output throughput, goodput, preemptions;
  * where the multiplicative policy does not win: for each load and each of mean TTFT,
    TPOT p99, hit ratio and goodput, the policies that beat it and by how much.
Every table names the command that produced its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- tables:begin -->", "<!-- tables:end -->"
WORKLOAD_ORDER = ("mooncake", "mooncake-full", "chatbot", "api", "coder")
TITLES = {
    "mooncake": "Mooncake conversation trace (first 3,000 requests)",
    "mooncake-full": "Mooncake conversation trace (all 12,031 requests, ×1 and ×2)",
    "chatbot": "ChatBot (synthetic, multi-turn)",
    "api": "API (synthetic, shared system prompts)",
    "coder": "Coder (synthetic, long shared repository context)",
}
HERO = "multiplicative"
# (label, key, lower is better, format)
JUDGED = (
    ("mean TTFT", "mean_ttft_ms", True, "{:.0f} ms"),
    ("TPOT p99", "p99_tpot_ms", True, "{:.1f} ms"),
    ("KV$ hit ratio", "prefix_hit_ratio", False, "{:.3f}"),
    ("goodput", "request_goodput", False, "{:.2f} req/s"),
)


def load_points(results: Path) -> dict[str, list[tuple[float, dict]]]:
    out: dict[str, list[tuple[float, dict]]] = {}
    for path in sorted(results.glob("*_x*.json")):
        name, _, load = path.stem.rpartition("_x")
        out.setdefault(name, []).append((float(load), json.loads(path.read_text())))
    for pts in out.values():
        pts.sort(key=lambda p: p[0])
    return out


def _f(v, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def workload_section(name: str, points: list[tuple[float, dict]], results_dir: Path, rel: str) -> list[str]:
    lines = [f"### {TITLES.get(name, name)}", ""]
    first = points[0][1]
    pols = list(first["policies"])
    bound = first["policies"][pols[0]]["prefix_hit_bound"]
    cfg = first["config"]
    lines.append(
        f"{cfg['num_requests']} requests, {cfg['instances']} × {cfg['profile']}, seed {cfg['seed']}, "
        f"goodput SLO TTFT ≤ 2 s and TPOT ≤ 100 ms. Infinite-cache hit bound: **{bound:.3f}**."
    )
    lines.append("")
    lines.append(
        "| load | policy | TTFT mean (ms) | TPOT p99 (ms) | KV$ hit | TTFT p50 (ms) | TTFT p99 (ms) | output tok/s | goodput (req/s) | preemptions |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for load, doc in points:
        for p in pols:
            r = doc["policies"][p]
            bold = "**" if p == HERO else ""
            lines.append(
                f"| ×{load:g} | {bold}{p}{bold} | {r['mean_ttft_ms']:.0f} | {r['p99_tpot_ms']:.1f} | "
                f"{r['prefix_hit_ratio']:.3f} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | {r['output_throughput']:.0f} | "
                f"{_f(r['request_goodput'], '{:.2f}')} | {r['preemptions']} |"
            )
    lines.append("")
    lines.append("Commands:")
    lines.append("")
    lines.append("```")
    lines += [doc.get("command", "(command not recorded)") for _, doc in points]
    lines.append("```")
    lines.append("")
    for load, _ in points:
        plots = results_dir / f"plots_{name}_x{load:g}"
        if plots.is_dir():
            pngs = sorted(p.name for p in plots.glob("*.png"))
            links = ", ".join(f"[{p.removesuffix('.png')}]({rel}/{plots.name}/{p})" for p in pngs)
            lines.append(f"Plots at ×{load:g} (TTFT CDF per policy; per-instance batch size over time): {links}")
            lines.append("")
    lines += losses(name, points)
    return lines


def losses(name: str, points: list[tuple[float, dict]]) -> list[str]:
    lines = [f"Where **{HERO}** does not win ({TITLES.get(name, name).split(' (')[0]}):", ""]
    any_loss = False
    for load, doc in points:
        res = doc["policies"]
        if HERO not in res:
            continue
        mine = res[HERO]
        for label, key, lower, fmt in JUDGED:
            if mine.get(key) is None:
                continue
            better = [
                (p, r[key])
                for p, r in res.items()
                if p != HERO and r.get(key) is not None and (r[key] < mine[key] if lower else r[key] > mine[key])
            ]
            if better:
                any_loss = True
                better.sort(key=lambda x: x[1], reverse=not lower)
                who = ", ".join(f"{p} {fmt.format(v)}" for p, v in better)
                lines.append(f"* ×{load:g}, {label}: {HERO} {fmt.format(mine[key])}; better: {who}")
    if not any_loss:
        lines.append("* nowhere on these four metrics.")
    lines.append("")
    return lines


def render(results: Path, rel: str = "results") -> str:
    """`rel`: the results folder as the document links it."""
    pts = load_points(results)
    lines: list[str] = []
    for name in [*WORKLOAD_ORDER, *sorted(set(pts) - set(WORKLOAD_ORDER))]:
        if name in pts:
            lines += workload_section(name, pts[name], results, rel)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "docs" / "results"),
                    help="folder of the JSONs bench/run_results.py wrote (default: docs/results in this repository)")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "RESULTS.md"),
                    help="the document whose tables are replaced, in place (default: docs/RESULTS.md in this repository)")
    args = ap.parse_args(argv)
    doc = Path(args.doc)
    text = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    results = Path(args.results)
    rel = os.path.relpath(results, doc.parent)
    doc.write_text(f"{head}{BEGIN}\n{render(results, rel)}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
