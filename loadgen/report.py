"""How a run shows itself: a rich progress bar on stderr while it runs, vllm's "Serving
Benchmark Result" block as a rich table at the end (plus one table per priority class and
one per TPOT SLO sent with `--tpot-slo-mix`, one of failures by reason when there are any), and the result dict as JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def make_progress(total: int, enabled: bool) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("[bold]bench serve"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )
    task = progress.add_task("requests", total=total, failed=0)
    return progress, task


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def result_table(result: dict[str, Any]) -> Table:
    table = Table(title="Serving Benchmark Result", show_header=False, title_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("Successful requests", result.get("completed")),
        ("Failed requests", result.get("failed")),
    ]
    if result.get("concurrency") is not None:
        rows.append(("Maximum request concurrency", result["concurrency"]))
    rows += [
        ("Benchmark duration (s)", result.get("duration")),
        ("Total input tokens", result.get("total_input_tokens")),
        ("Total generated tokens", result.get("total_output_tokens")),
        ("Request throughput (req/s)", result.get("request_throughput")),
    ]
    if result.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", result["request_goodput"]))
    rows += [
        ("Output token throughput (tok/s)", result.get("output_throughput")),
        ("Total token throughput (tok/s)", result.get("total_token_throughput")),
    ]
    for label, value in rows:
        table.add_row(label, _fmt(value))
    for key, title, short in _SECTIONS:
        table.add_section()
        table.add_row(f"[bold]{title}", "")
        for stat, word in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            table.add_row(f"{word} {short} (ms)", _fmt(result.get(f"{stat}_{key}_ms")))
    return table


def priority_table(by_priority: dict[str, dict[str, Any]], title: str = "By priority class",
                   first: str = "class") -> Table:
    """One row per group of requests (a class, or a TPOT SLO with `first="TPOT SLO"`)."""
    table = Table(title=f"{title} (latencies in ms)", box=box.SIMPLE_HEAD)
    columns = (
        (first, None), ("ok", "completed"), ("failed", "failed"), ("req/s", "request_throughput"),
        ("good/s", "request_goodput"), ("TTFT\np50", "median_ttft_ms"), ("TTFT\np99", "p99_ttft_ms"),
        ("TPOT\np50", "median_tpot_ms"), ("TPOT\np99", "p99_tpot_ms"), ("E2EL\np99", "p99_e2el_ms"),
    )  # fmt: skip
    for header, _ in columns:
        table.add_column(header, justify="left" if header == first else "right", no_wrap=True)
    for name, b in by_priority.items():
        table.add_row(
            name, *(_fmt(b[key], 1) if key.endswith("_ms") else _fmt(b[key]) for _, key in columns[1:])
        )
    return table


def print_result(result: dict[str, Any], console: Console | None = None) -> None:
    """Print a run's result (a dict from run_bench) to stdout."""
    console = console or Console()
    console.print(result_table(result))
    by_priority = result.get("by_priority") or {}
    if len(by_priority) > 1:
        console.print(priority_table(by_priority))
    if by_slo := result.get("by_tpot_slo"):
        console.print(priority_table(by_slo, "By TPOT SLO sent, ms (good: its own TPOT SLO met)", "TPOT SLO"))
    if errors := result.get("errors"):
        table = Table(title="Failures by reason")
        table.add_column("reason")
        table.add_column("requests", justify="right")
        table.add_column("first message")
        messages = result.get("error_messages") or {}
        for reason, count in errors.items():
            table.add_row(reason, str(count), messages.get(reason, ""))
        console.print(table)


def jsonable(value: Any) -> Any:
    """Non-finite floats as strings ("inf", "nan"): strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def write_result_json(result: Any, path: str | Path) -> None:
    """Strict JSON (see jsonable); an object JSON has no type for is written as its str."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(result), indent=2, allow_nan=False, default=str) + "\n")
