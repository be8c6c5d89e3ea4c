"""bench.control_plane's tables: its report (TTFT per path, the added TTFT, CPU per process, the
rate steps, the hop profile, the targets met or missed) and the side-by-side comparison of two
fleets, printed with rich from the result dictionary `bench.control_plane` measures and writes."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def print_report(result: dict[str, Any], console: Console) -> None:
    if result.get("paired_ttft"):
        print_side_by_side(result, console)
        return
    t = Table(
        title="TTFT through the control plane (max_tokens = 1, zero-latency workers)", box=box.SIMPLE_HEAD
    )
    for col in ("path", "requests", "failed", "p50 (ms)", "p90 (ms)", "p99 (ms)"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for path, r in result["ttft"].items():
        t.add_row(
            path,
            str(r["completed"] + r["failed"]),
            str(r["failed"]),
            f"{r['p50_ttft_ms']:.3f}",
            f"{r['p90_ttft_ms']:.3f}",
            f"{r['p99_ttft_ms']:.3f}",
        )
    console.print(t)
    for path in ("nats", "http"):
        print_added({"": result["engine_paired"]} if result.get("engine_paired") else {}, console, path)
    if result.get("cpu_ms_per_request"):
        cpu = result["cpu_ms_per_request"]
        t = Table(title="CPU ms per request by process (user + system over the TTFT runs, warm-up included; "
                        "then less what each process spends idle, sampled for a few seconds before)",
                  box=box.SIMPLE_HEAD)
        for col in ("process", *(p.upper() for p in cpu)):
            t.add_column(col, justify="left" if col == "process" else "right")
        for name in cpu["nats"]:
            t.add_row(name, *(f"{cpu[p].get(name, float('nan')):.3f}" for p in cpu))
        t.add_row("total", *(f"{sum(cpu[p].values()):.3f}" for p in cpu))
        console.print(t)

    t = Table(title=f"Offered rate steps ({result.get('rate_path', 'nats').upper()}, max_tokens = 4; req/s and ms)",
              box=box.SIMPLE_HEAD)
    columns = (
        "rate",
        "offered",
        "achieved",
        "failed",
        "TTFT\np50",
        "TTFT\np99",
        "E2EL\np99",
        "send\nlag",
        "held",
    )
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    for s in result["steps"]:
        t.add_row(
            f"{s['rate']:g}",
            f"{s['offered']:.0f}",
            f"{s['achieved']:.0f}",
            str(s["failed"]),
            f"{s['p50_ttft_ms']:.1f}",
            f"{s['p99_ttft_ms']:.1f}",
            f"{s['p99_e2el_ms']:.1f}",
            f"{s['max_send_lag_ms']:.1f}",
            "[green]yes" if s["held"] else "[red]no",
        )
    console.print(t)

    if result.get("hops"):
        hops = result["hops"]
        t = Table(title=f"Where the first token's time goes (mean ms over {hops['requests']} requests a path, "
                        "tracing on; the segments add up to the total)", box=box.SIMPLE_HEAD)
        for col in ("segment", "NATS", "HTTP"):
            t.add_column(col, justify="left" if col == "segment" else "right")
        names = ["client → edge", "edge → admission", "client → admission",
                 *(n for n in hops["nats"]["segments"] if n not in ("client → admission", "total (TTFT)")),
                 "total (TTFT)"]
        for name in names:
            cells = [f"{hops[p]['segments'][name]['mean_ms']:.3f}" if name in hops[p]["segments"] else "–"
                     for p in ("nats", "http")]
            t.add_row(name, *cells)
        t.add_row("median TTFT", *(f"{hops[p]['segments']['total (TTFT)']['p50_ms']:.3f}" for p in ("nats", "http")))
        console.print(t)

    t = Table(title="Control-plane targets", box=box.SIMPLE_HEAD)
    for col in ("target", "measured", "goal", ""):
        t.add_column(col, justify="left" if col == "target" else "right")
    for v in result["verdicts"]:
        t.add_row(v["what"], f"{v['measured']:.2f}", v["goal"], "[green]met" if v["met"] else "[red]missed")
    console.print(t)


def print_added(by_label: dict[str, dict[str, Any]], console: Console, path: str = "nats") -> None:
    """The control plane's added TTFT over `path`: the full path less the engine alone (over
    HTTP: a worker's own HTTP front). `by_label`: label → {path: {"ttft": …}, "added"/"http_added": …}."""
    key = "added" if path == "nats" else "http_added"
    by_label = {label: r for label, r in by_label.items() if r.get(key) and path in r}
    if not by_label:
        return
    alone = "the engine alone" if path == "nats" else "the engine's own HTTP front"
    t = Table(title=f"TTFT added by the control plane, {path.upper()} (ms): through it less {alone}, "
                    "interleaved", box=box.SIMPLE_HEAD)
    for col in ("code", "full p50", "engine alone p50", "added p50", "added p50, paired"):
        t.add_column(col, justify="left" if col == "code" else "right")
    for label, r in by_label.items():
        a = r[key]
        t.add_row(label or "this tree", f"{r[path]['ttft'].get('p50_ms', float('nan')):.3f}",
                  f"{a.get('engine_p50_ms', float('nan')):.3f}", f"{a.get('p50_ms', float('nan')):.3f}",
                  f"{a.get('paired_p50_ms', float('nan')):.3f}")
    console.print(t)


def print_side_by_side(result: dict[str, Any], console: Console) -> None:
    routers, admissions = result.get("routers", {}), result.get("admissions", {})
    edges = result.get("edge_processes", {})

    def named(k: str) -> str:  # each fleet named with where it runs its router, admission and edge
        where = [f"router {routers[k]}"] if k in routers else []
        where += [f"admission {admissions[k]}"] if k in admissions else []
        where += [f"edge {'in-queue' if edges[k] == 0 else f'×{edges[k]}'}"] if k in edges else []
        return f"{k} ({', '.join(where)})" if where else k

    ttft = {named(k): v for k, v in result["paired_ttft"].items()}
    hops = {named(k): v for k, v in (result["paired_hops"] or {}).items()}
    labels = list(ttft)
    t = Table(title="TTFT through the control plane, side by side (ms; max_tokens = 1, zero-latency workers, "
                    "requests interleaved)", box=box.SIMPLE_HEAD)
    t.add_column("path")
    t.add_column("code")
    for col in ("requests", "failed", "p50", "p90", "p99", "mean"):
        t.add_column(col, justify="right")
    for path in ("nats", "http"):
        for label in labels:
            r = ttft[label][path]
            t.add_row(path, label, str(r["sent"]), str(r["sent"] - r["completed"]),
                      *(f"{r['ttft'][k]:.3f}" for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")))
    console.print(t)
    for path in ("nats", "http"):
        print_added({label: {path: ttft[label][path], "added": ttft[label]["nats"].get("added"),
                             "http_added": ttft[label]["http"].get("added")} for label in labels}, console, path)
    for path, key, what in (("nats", "cpu", "idle loops included"), ("http", "cpu", "idle loops included"),
                            ("nats", "busy_cpu", "less each process's idle rate"),
                            ("http", "busy_cpu", "less each process's idle rate")):
        cpu = {label: ttft[label].get(f"{path}_{key}_ms_per_request", {}) for label in labels}
        names = list(dict.fromkeys(name for label in labels for name in cpu[label]))  # each fleet's processes
        if not names:
            continue
        t = Table(title=f"CPU ms per request by process, {path.upper()} path (user + system over the run, "
                        f"{what})", box=box.SIMPLE_HEAD)
        t.add_column("process")
        for label in labels:
            t.add_column(label, justify="right")
        for name in names:
            t.add_row(name, *(f"{cpu[label][name]:.3f}" if name in cpu[label] else "–" for label in labels))  # –: no such process
        t.add_row("total", *(f"{sum(cpu[label].values()):.3f}" for label in labels))
        console.print(t)
    if hops:
        for path, names in (("nats", hop_profile_names("nats")), ("http", hop_profile_names("http"))):
            t = Table(title=f"Where the first token's time goes, {path.upper()} (mean ms, tracing on; "
                            "the segments add up to the total)", box=box.SIMPLE_HEAD)
            t.add_column("segment")
            for label in labels:
                t.add_column(label, justify="right")
            def cell(label: str, name: str, stat: str, path: str = path) -> str:
                got = hops[label][path]["segments"].get(name)
                return f"{got[stat]:.3f}" if got else "–"  # "–": that code notes no such instant

            for name in (*names, "total (TTFT)"):
                t.add_row(name, *(cell(label, name, "mean_ms") for label in labels))
            t.add_row("median TTFT", *(cell(label, "total (TTFT)", "p50_ms") for label in labels))
            console.print(t)
    t = Table(title="Control-plane targets (this tree)", box=box.SIMPLE_HEAD)
    for col in ("target", "measured", "goal", ""):
        t.add_column(col, justify="left" if col == "target" else "right")
    for v in result["verdicts"]:
        t.add_row(v["what"], f"{v['measured']:.2f}", v["goal"], "[green]met" if v["met"] else "[red]missed")
    console.print(t)


def hop_profile_names(path: str) -> tuple[str, ...]:
    from bench import hop_profile

    return hop_profile.NATS_SEGMENTS if path == "nats" else hop_profile.HTTP_SEGMENTS
