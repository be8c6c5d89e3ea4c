"""Mitosis scaling acted on in the simulator (issue 13): a load that rises and falls, the
macro-instance controller's seed rules (grow on > 5% SLO misses or > 85% utilisation over
5 min, shrink under 40% over 10 min, split past N_upper = the macro size into N_lower = half,
merge back), and the simulator starting and stopping workers as it says. SLO misses include
the queue's late backlog (services.macro_instance.mitosis.backlog_late_share): with flow
control on, that is where a saturated fleet's backlog waits.

    .venv/bin/python bench/ecoserve_mitosis.py [--workload chatbot] [--profile P]
        [--instances N] [--macro-size K] [--mode ecoserve|nodg]
        [--phases RATE:MIN,RATE:MIN,...] [--ttft-ms T] [--tpot-ms T] [--json FILE] [--plot PNG]

The workload's requests (bodies as its generator makes them) arrive as a Poisson process
whose rate steps through `--phases` (req/s for so many minutes). Prints the scaling log and
the goodput; the plot shows workers and macro-instances over time against the offered rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.loadgen.workloads import open_workload  # noqa: E402
from tokenyard.simulator.cluster import ClusterSim, SimConfig, with_slos  # noqa: E402
from tokenyard.simulator.metrics import result  # noqa: E402

from bench._out import write_result  # noqa: E402


def retimed(workload, phases: list[tuple[float, float]], seed: int):
    """The workload's first requests, re-timed to a Poisson process stepping through
    (rate req/s, minutes) phases; as many requests as the phases need."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t0 = 0.0
    for rate, minutes in phases:
        t, end = t0, t0 + minutes * 60.0
        while True:
            t += rng.exponential(1.0 / rate)
            if t >= end:
                break
            times.append(t)
        t0 = end
    items = workload.items()
    if len(items) < len(times):
        raise ValueError(f"the workload made {len(items)} requests; the phases need {len(times)}")
    return [dataclasses.replace(it, arrival_s=t) for it, t in zip(items, times, strict=False)]


class _Items:
    def __init__(self, name, block_tokens, items):
        self.name, self.block_tokens, self._items = name, block_tokens, items

    def items(self):
        return self._items


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="chatbot",
                   help="workload whose requests are replayed: chatbot | api | coder | trace:PATH, "
                        "as tokenyard sim takes them (default: %(default)s)")
    p.add_argument("--profile", default="a100-llama3-8b",
                   help="the simulator's latency profile, as tokenyard sim --profile takes it (default: %(default)s)")
    p.add_argument("--instances", type=int, default=4,
                   help="simulated engine instances at the start; the controller adds and removes them (default: %(default)s)")
    p.add_argument("--macro-size", type=int, default=4,
                   help="workers per macro-instance; one grown past it is split in half (default: %(default)s)")
    p.add_argument("--mode", default="ecoserve", help="macro-instance mode: ecoserve or nodg (default: %(default)s)")
    p.add_argument("--phases", default="2:10,14:20,2:25", help="RATE:MINUTES,… of the offered load")
    p.add_argument("--ttft-ms", type=float, default=2000.0,
                   help="time-to-first-token SLO, milliseconds (default: %(default)s)")
    p.add_argument("--tpot-ms", type=float, default=100.0,
                   help="time-per-output-token SLO, milliseconds (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the requests and their arrival times (default: %(default)s)")
    p.add_argument("--json", default=None, help="write the result as JSON to this file (default: not written)")
    p.add_argument("--plot", default=None,
                   help="draw workers and macro-instances over time, against the offered rate, to this PNG file "
                        "(default: no plot)")
    args = p.parse_args()
    phases = [(float(r), float(m)) for r, m in (x.split(":") for x in args.phases.split(","))]
    need = int(sum(r * m * 60.0 for r, m in phases) * 1.2) + 100
    wl = open_workload(args.workload, num_requests=need, seed=args.seed)
    items = retimed(wl, phases, args.seed)
    goodput = {"ttft": args.ttft_ms, "tpot": args.tpot_ms}
    cfg = with_slos(SimConfig(instances=args.instances, macro_size=args.macro_size, mode=args.mode,
                              profile=args.profile, mitosis=True), goodput)
    sim = ClusterSim(cfg, wl.block_tokens)
    sim.run(items)
    res = result(sim, items, goodput)
    for t, kind, mid, other in sim.scaling_log:
        print(f"{t:8.1f} s  {kind:8} {mid:4} {other}")
    sizes = [x[1] for x in sim.fleet_samples]
    print(f"requests {len(items)}, completed {res['completed']}, goodput {res['request_goodput']:.2f} req/s "
          f"of {res['request_throughput']:.2f}, workers {min(sizes)}…{max(sizes)}, "
          f"macro-instances up to {max(x[2] for x in sim.fleet_samples)}, decisions {res.get('scaling')}")
    doc = {"config": vars(args), "scaling_log": sim.scaling_log, "fleet_samples": sim.fleet_samples,
           "result": {k: v for k, v in res.items() if k not in ("wall_s", "sim_speed")}}
    write_result(args.json, doc)
    if args.plot:
        plot(sim, phases, args.plot)
    return 0


def plot(sim, phases, path) -> None:
    """Top: workers and macro-instances against the offered load, each mitosis decision marked.
    Bottom: what the controller grew on — the queue's late-backlog share — and the share of
    requests refused (admission or the queue's deadline) per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([s[0] for s in sim.fleet_samples]) / 60.0
    fig, (ax, low) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(3, 2))
    ax.step(t, [s[1] for s in sim.fleet_samples], where="post", label="workers running")
    ax.step(t, [s[2] for s in sim.fleet_samples], where="post", label="macro-instances")
    marks = {"grow": ("^", "tab:green"), "split": ("D", "tab:purple"), "shrink": ("v", "tab:red"),
             "merge": ("s", "tab:brown")}
    top = max(s[1] for s in sim.fleet_samples) + 1.0
    for kind, (marker, color) in marks.items():
        times = [e[0] / 60.0 for e in sim.scaling_log if e[1] == kind]
        if times:
            ax.scatter(times, [top] * len(times), marker=marker, color=color, label=f"{kind} ({len(times)})", zorder=3)
    ax.set_ylabel("count")
    ax.set_ylim(0, top + 1.0)
    ax2 = ax.twinx()
    edges, rates, t0 = [], [], 0.0
    for rate, minutes in phases:
        edges += [t0, t0 + minutes]
        rates += [rate, rate]
        t0 += minutes
    ax2.plot(edges, rates, color="grey", linestyle="--", label="offered req/s")
    ax2.set_ylabel("offered load (req/s)")
    ax2.set_ylim(0, max(rates) * 1.25)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8, ncol=2)
    ax.set_title("Mitosis scaling in the simulator")
    low.plot(t, [s[3] for s in sim.fleet_samples], color="tab:orange", label="queue: late-backlog share")
    minute = np.zeros(int(t[-1]) + 1)
    refused = np.zeros_like(minute)
    for st in sim.reqs.values():
        k = min(int(st.item.arrival_s // 60.0), len(minute) - 1)
        minute[k] += 1
        refused[k] += bool(st.error)
    share = np.divide(refused, minute, out=np.zeros_like(minute), where=minute > 0)
    low.step(np.arange(len(minute)), share, where="post", color="tab:red", label="refused share (per arrival minute)")
    low.set_xlabel("time (min)")
    low.set_ylabel("share")
    low.set_ylim(0, 1.05)
    low.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
