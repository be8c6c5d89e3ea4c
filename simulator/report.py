"""What `tokenyard sim` shows: one rich table (a row per policy, a column per metric, each
value with its ratio to the first policy's), the result JSON (docs/ARCHITECTURE.md §9: one result object per
policy under `policies`), and PNG plots — the TTFT CDF of every policy, and each instance's
running batch size over time per policy (matplotlib, the `sim` extra)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("done", "completed", "{:.0f}"),
    ("fail", "failed", "{:.0f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("goodput", "request_goodput", "{:.2f}"),
    ("TTFT mean", "mean_ttft_ms", "{:.0f}"),
    ("TTFT p50", "median_ttft_ms", "{:.0f}"),
    ("TTFT p99", "p99_ttft_ms", "{:.0f}"),
    ("TPOT mean", "mean_tpot_ms", "{:.1f}"),
    ("TPOT p99", "p99_tpot_ms", "{:.1f}"),
    ("ITL p99", "p99_itl_ms", "{:.1f}"),
    ("E2E mean", "mean_e2el_ms", "{:.0f}"),
    ("hit", "prefix_hit_ratio", "{:.3f}"),
    ("prefill cv", "load_balance.prefill_tokens_cv", "{:.3f}"),
    ("BS max/min", "load_balance.batch_size_max_over_min", "{:.2f}"),
    ("preempt", "preemptions", "{:.0f}"),
    ("eco fallback", "ecoserve_filter.fallbacks", "{:.0f}"),
    ("speed", "sim_speed", "{:.0f}"),
)
"""(header, result key, format) of the table; latencies in ms, speed = simulated s / wall s."""

GROUPS = (
    ("requests", ("done", "fail", "req/s", "goodput", "preempt")),
    ("first token and end to end", ("TTFT mean", "TTFT p50", "TTFT p99", "E2E mean")),
    ("decoding and EcoServe", ("TPOT mean", "TPOT p99", "ITL p99", "eco fallback")),
    ("cache and balance", ("hit", "prefill cv", "BS max/min", "speed")),
)
"""COLUMNS split into tables that each fit a 100-column terminal."""
WIDTH = 100


def lookup(result: dict[str, Any], key: str) -> Any:
    value: Any = result
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _fmt(fmt: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return fmt.format(v)


def table(results: dict[str, dict[str, Any]], title: str = "", headers: tuple[str, ...] | None = None) -> Table:
    """A row per policy; each cell is the value and, below the first row, its ratio to the
    first policy's. `headers` picks columns (default: all)."""
    names = list(results)
    base = results[names[0]]
    bound = base.get("prefix_hit_bound")
    caption = f"latencies in ms · ratio to {names[0]} in brackets"
    if isinstance(bound, float):
        caption += f" · infinite-cache hit bound {bound:.3f}"
    columns = [c for c in COLUMNS if headers is None or c[0] in headers]
    t = Table(title=title or None, caption=caption)
    t.add_column("policy", no_wrap=True, min_width=max(len(n) for n in names))
    for header, _, _ in columns:
        t.add_column(header, justify="right")
    for i, name in enumerate(names):
        cells = [name]
        for _, key, fmt in columns:
            v, b = lookup(results[name], key), lookup(base, key)
            cell = _fmt(fmt, v)
            if i and isinstance(v, int | float) and isinstance(b, int | float) and b:
                cell += f" ({v / b:.2f})"
            cells.append(cell)
        t.add_row(*cells)
    return t


def print_results(results: dict[str, dict[str, Any]], title: str = "", console: Console | None = None) -> None:
    """The table in GROUPS of columns, one under the other, each at most WIDTH columns wide."""
    console = console or Console(width=WIDTH)
    for k, (name, headers) in enumerate(GROUPS):
        t = table(results, f"{title} · {name}" if title else name, headers)
        if k < len(GROUPS) - 1:
            t.caption = None  # said once, under the last
        console.print(t)


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def plots(series: dict[str, dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """`series[policy]` = {"ttft_s": [...], "sample_s": [...], "batch_size": {worker: [...]}}.
    Writes ttft_cdf.png and batch_size_<policy>.png; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, s in series.items():
        x = np.sort(np.asarray(s["ttft_s"], dtype=float))
        if len(x):
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "ttft_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    for name, s in series.items():
        # A heat map, instance × time: sixteen overlaid lines are unreadable, a hot spot
        # (one instance's batch growing while others idle) shows as one bright row.
        rows = list(s["batch_size"].values())
        t = np.asarray(s["sample_s"], dtype=float)
        grid = np.zeros((len(rows), len(t)))
        for i, bs in enumerate(rows):
            grid[i, : len(bs)] = bs[: len(t)]
        fig, ax = plt.subplots(figsize=(8, 0.25 * len(rows) + 2))
        extent = (float(t[0]) if len(t) else 0.0, float(t[-1]) if len(t) else 1.0, len(rows) - 0.5, -0.5)
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", extent=extent, cmap="viridis")
        fig.colorbar(im, ax=ax, label="running batch size")
        if len(rows) <= 32:
            ax.set_yticks(range(len(rows)), list(s["batch_size"]), fontsize=6)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("instance")
        ax.set_title(f"per-instance batch size over time — {name}")
        fig.tight_layout()
        paths.append(out / f"batch_size_{name}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
