"""Refill the generated tables of docs/results-ecoserve.md from the JSON the runs wrote
(bench/run_ecoserve.sh): each `<!-- table:NAME -->` … `<!-- end -->` block is replaced by the
table of docs/results/ecoserve/NAME.json; the prose around them stays as written.

    .venv/bin/python bench/ecoserve_doc.py [--doc docs/results-ecoserve.md] [--dir docs/results/ecoserve]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SYSTEMS = ("vllm", "sarathi", "distserve", "distserve-search", "ecoserve", "ecoserve-pure")
BASELINES = ("vllm", "sarathi", "distserve", "distserve-search")


def goodput_table(doc: dict) -> str:
    names = [s for s in SYSTEMS if s in doc["systems"]]
    head = "| load | " + " | ".join(f"{n} goodput (attain.)" for n in names)
    head += " | eco / best baseline | eco-pure / best baseline | TTFT p99 s (" + ", ".join(names) + ") | TPOT p99 ms"
    head += " | refused + expired |"
    lines = [head, "|" + "---|" * (len(names) + 6)]
    for row in doc["rows"]:
        cells = [f"×{row['rate_scale']:g}"]
        for n in names:
            r = row[n]
            split = f", P:D {r['pd_search']['pd_prefill']}:{doc['macro_size'] - r['pd_search']['pd_prefill']}" if "pd_search" in r else ""
            cells.append(f"{r['request_goodput']:.2f} ({r['attainment']:.0%}{split})")
        base = max(row[b]["request_goodput"] for b in BASELINES if b in row)
        for eco in ("ecoserve", "ecoserve-pure"):
            cells.append(f"{row[eco]['request_goodput'] / base:.2f}" if eco in row and base else "–")
        cells.append(" / ".join(f"{row[n]['p99_ttft_ms'] / 1000:.1f}" for n in names))
        cells.append(" / ".join(f"{row[n]['p99_tpot_ms']:.0f}" for n in names))
        cells.append(" / ".join(str(row[n].get("refused", 0) + row[n].get("expired", 0)) for n in names))
        lines.append("| " + " | ".join(cells) + " |")
    best = doc["max_rate_scale"]
    lines.append("")
    lines.append("Attainment: the share of the offered requests completed within both SLOs (a refused one missed). "
                 "Highest swept load with ≥ 90% of requests within SLO: "
                 + ", ".join((f"{n} ×{best[n]:g}" if best[n] is not None else f"{n} none") for n in names) + ".")
    fb = [(row["rate_scale"], row[e]["ecoserve_filter"]) for row in doc["rows"] for e in ("ecoserve",) if e in row]
    if fb:
        def why(f: dict) -> str:
            r = f.get("refused") or {}
            return ", ".join(f"{k} {v}" for k, v in sorted(r.items())) or "none"

        lines.append("EcoServe (mixed phases) filter fallbacks — every candidate refused — and candidate refusals by "
                     "reason: " + "; ".join(f"×{x:g} {f['fallbacks']}/{f['decisions']} ({why(f)})" for x, f in fb) + ".")
    return "\n".join(lines)


def issue_table(out_dir: Path) -> str:
    lines = ["| load | mode | req/s | goodput | attain. (of offered) | refused + expired | TTFT mean / p99 ms | "
             "TPOT mean / p99 ms | goodput ratio to ecoserve |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in (1, 2):
        path = out_dir / f"issue_coder_x{x}.json"
        if not path.exists():
            continue
        runs = json.loads(path.read_text())["policies"]
        eco = runs["ecoserve"]["request_goodput"]
        for mode, r in runs.items():
            att = r["request_goodput"] / r["request_throughput"] if r["request_throughput"] else 0.0
            o = r["outcomes"]["all"]
            offered = sum(o[k] for k in ("refused", "expired", "met_slo", "missed_slo", "failed_other"))
            att *= r["completed"] / offered if offered else 0.0
            lines.append(f"| ×{x} | {mode} | {r['request_throughput']:.2f} | {r['request_goodput']:.2f} | {att:.0%} | "
                         f"{o['refused'] + o['expired']} | "
                         f"{r['mean_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | {r['mean_tpot_ms']:.0f} / {r['p99_tpot_ms']:.0f} | "
                         f"{r['request_goodput'] / eco if eco else float('nan'):.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--doc", default="docs/results-ecoserve.md",
                   help="the document whose table blocks are refilled, in place (default: %(default)s)")
    p.add_argument("--dir", default="docs/results/ecoserve",
                   help="folder of the runs' NAME.json files, one per table (default: %(default)s)")
    args = p.parse_args()
    doc_path, out_dir = Path(args.doc), Path(args.dir)
    text = doc_path.read_text()

    def refill(m: re.Match) -> str:
        name = m.group(1)
        if name == "issue":
            body = issue_table(out_dir)
        else:
            path = out_dir / f"{name}.json"
            body = goodput_table(json.loads(path.read_text())) if path.exists() else "(not run)"
        return f"<!-- table:{name} -->\n{body}\n<!-- end -->"

    doc_path.write_text(re.sub(r"<!-- table:(\S+) -->.*?<!-- end -->", refill, text, flags=re.S))
    return 0


if __name__ == "__main__":
    sys.exit(main())
