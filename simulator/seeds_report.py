"""What `tokenyard sim --seeds` shows: the summary of simulator/seeds.py as rich tables, each at
most report.WIDTH columns wide —

    mean over the seeds     a row per policy, the headline figures in two tables (requests;
                            latencies), as `tokenyard sim` splits its own
    paired difference       a row per figure, for each policy after the first two columns:
                            mean ± standard error of (policy − first) over the seeds, and on
                            how many seeds it beats the first; policies spread over as many
                            tables as the width needs
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from tokenyard.simulator.report import WIDTH
from tokenyard.simulator.seeds import Figure, figures

MEAN_GROUPS = (
    ("requests", ("met_slo", "refused", "expired", "request_goodput", "request_throughput")),
    ("latencies", ("mean_ttft_ms", "p99_ttft_ms", "p99_tpot_ms")),
)


def seeds_text(seeds: list[int]) -> str:
    """[101, 102, 103, 7] → '101-103,7': consecutive runs as ranges, as --seeds takes them."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if j == i else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


def _num(fmt: str, v: float | None) -> str:
    return "–" if v is None else fmt.format(v)


def mean_table(summary: dict[str, Any], figs: tuple[Figure, ...], title: str, kind: str = "policy") -> Table:
    names = list(summary["mean"])
    t = Table(title=title or None)
    t.add_column(kind, no_wrap=True, min_width=max(len(n) for n in names))
    for f in figs:
        t.add_column(f.label, justify="right")
    for name in names:
        t.add_row(name, *(_num(f.fmt, summary["mean"][name][f.name]) for f in figs))
    return t


def diff_cell(f: Figure, p: dict[str, Any]) -> tuple[str, str]:
    """('+19.7 ± 9.4', '10/12') for one figure of one policy."""
    if p["mean"] is None:
        return "–", "–"
    signed = f.fmt.replace("{:", "{:+", 1)
    cell = signed.format(p["mean"]) + " ± " + _num(f.fmt, p["se"])
    return cell, f"{p['better']}/{p['n']}"


def _peer_width(name: str, cells: list[tuple[str, str]]) -> int:
    """Columns one policy takes: its two columns, each with rich's padding and border."""
    first = max(len(name), *(len(c[0]) for c in cells))
    second = max(len("better"), *(len(c[1]) for c in cells))
    return first + second + 6


def diff_tables(summary: dict[str, Any], figs: tuple[Figure, ...], title: str) -> list[Table]:
    peers = list(summary["paired"])
    cells = {name: [diff_cell(f, summary["paired"][name][f.name]) for f in figs] for name in peers}
    label_width = max(len("figure"), *(len(f.label) for f in figs)) + 4
    chunks: list[list[str]] = []
    used = WIDTH
    for name in peers:
        w = _peer_width(name, cells[name])
        if not chunks or used + w > WIDTH:
            chunks.append([])
            used = label_width
        chunks[-1].append(name)
        used += w
    tables = []
    for chunk in chunks:
        t = Table(title=title or None)
        t.add_column("figure", no_wrap=True)
        for name in chunk:
            t.add_column(name, justify="right", no_wrap=True)
            t.add_column("better", justify="right", no_wrap=True)
        for i, f in enumerate(figs):
            row = [f.label]
            for name in chunk:
                row.extend(cells[name][i])
            t.add_row(*row)
        tables.append(t)
    return tables


def legend(summary: dict[str, Any], kind: str = "policy") -> str:
    """What the paired cells mean; printed under the tables at full width (as a caption it
    would wrap to a narrow table's)."""
    base, n = summary["baseline"], len(summary["seeds"])
    return (
        f"each cell: {kind} − {base} on the same seed, mean ± standard error over {n} seeds; "
        f"better: on how many seeds it beats {base} (more met SLO, goodput, req/s; fewer refused, "
        "expired; lower latencies)"
    )


def print_summary(summary: dict[str, Any], title: str = "", goodput: bool = False,
                  console: Console | None = None, kind: str = "policy") -> None:
    """A headline (title, seeds), then the tables under short titles: a long title wraps
    over a narrow table."""
    console = console or Console(width=WIDTH)
    figs = figures(goodput)
    seeds = summary["seeds"]
    head = f"{title} · " if title else ""
    console.print(f"{head}{len(seeds)} seeds ({seeds_text(seeds)})", style="bold", highlight=False)
    for group, names in MEAN_GROUPS:
        chosen = tuple(f for f in figs if f.name in names)
        t = mean_table(summary, chosen, f"mean over the seeds · {group}", kind)
        if group == "latencies":
            t.caption = "latencies in ms"
        console.print(t)
    if summary["paired"]:
        for t in diff_tables(summary, figs, f"paired difference to {summary['baseline']}"):
            console.print(t)
        console.print(legend(summary, kind), style="italic", highlight=False)
