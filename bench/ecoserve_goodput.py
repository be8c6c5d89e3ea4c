"""EcoServe (partial disaggregation in time) vs NoDG on the cluster simulator: goodput at fixed
TTFT/TPOT SLOs over a load sweep, same fleet, same requests (issue 8's results).

    .venv/bin/python bench/ecoserve_goodput.py [--workload W] [--instances N] [--macro-size K]
        [--profile P] [--rates a,b,c] [--num-requests N] [--ttft-ms T] [--tpot-ms T]
        [--min-phase-s S] [--stagger-s S] [--json FILE]

For each rate scale and mode it runs `simulator.run.simulate` (what `tokenyard sim --macro-size K
--mode nodg|ecoserve` runs) with EcoServe's constraint check and phase rules held to the same
SLOs the goodput counts against. Prints one row per (rate, mode): throughput, goodput, SLO
attainment, TTFT mean/p99, TPOT mean/p99; then the ratio of goodputs, and the highest swept
rate at which each mode still meets `--attainment` (default 90%) of requests within SLO.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.loadgen.workloads import open_workload  # noqa: E402
from tokenyard.services.macro_instance.rolling import RollingConfig  # noqa: E402
from tokenyard.shared.ecoserve import EcoConfig  # noqa: E402
from tokenyard.simulator.cluster import ChainCache, SimConfig  # noqa: E402
from tokenyard.simulator.run import simulate  # noqa: E402

WORKLOADS = {"prefill-heavy": "azure-code", "decode-heavy": "azure-conv"}  # the shipped Azure traces
KEYS = ("request_throughput", "request_goodput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms")


def run(args) -> dict:
    spec = WORKLOADS.get(args.workload, args.workload)
    goodput = {"ttft": args.ttft_ms, "tpot": args.tpot_ms}
    eco = {"rolling": RollingConfig(EcoConfig(ttft_slo_ms=args.ttft_ms, tpot_slo_ms=args.tpot_ms),
                                    min_phase_s=args.min_phase_s, stagger_s=args.stagger_s)}
    out: dict = {"workload": spec, "instances": args.instances, "macro_size": args.macro_size,
                 "profile": args.profile, "policy": args.policy, "slo_ms": goodput, "num_requests": args.num_requests,
                 "min_phase_s": args.min_phase_s, "stagger_s": args.stagger_s, "rows": []}
    for scale in args.rates:
        wl = open_workload(spec, num_requests=args.num_requests, rate_scale=scale, seed=args.seed)
        chains = ChainCache()
        row: dict = {"rate_scale": scale}
        for mode in ("nodg", "ecoserve"):
            cfg = SimConfig(instances=args.instances, profile=args.profile, policy=args.policy,
                            macro_size=args.macro_size, mode=mode, macro_options=eco if mode == "ecoserve" else {})
            res = simulate(wl, cfg, goodput, chains)
            row[mode] = {k: res[k] for k in KEYS} | {
                "completed": res["completed"],
                "attainment": res["request_goodput"] / res["request_throughput"] if res["request_throughput"] else 0.0,
                "sim_speed": res.get("sim_speed"),
            }
        row["goodput_ratio"] = row["ecoserve"]["request_goodput"] / max(row["nodg"]["request_goodput"], 1e-9)
        out["rows"].append(row)
        print_row(row)
    for mode in ("nodg", "ecoserve"):
        ok = [r["rate_scale"] for r in out["rows"] if r[mode]["attainment"] >= args.attainment]
        out[f"max_rate_scale_{mode}"] = max(ok) if ok else None
    print(f"highest swept rate scale with ≥ {args.attainment:.0%} within SLO: "
          f"nodg {out['max_rate_scale_nodg']}, ecoserve {out['max_rate_scale_ecoserve']}")
    return out


def print_row(row: dict) -> None:
    for mode in ("nodg", "ecoserve"):
        r = row[mode]
        print(f"x{row['rate_scale']:<5} {mode:9} thr {r['request_throughput']:7.2f} good {r['request_goodput']:7.2f} "
              f"attain {r['attainment']:6.1%} ttft {r['mean_ttft_ms']:8.0f}/{r['p99_ttft_ms']:8.0f} "
              f"tpot {r['mean_tpot_ms']:6.1f}/{r['p99_tpot_ms']:6.1f}", flush=True)
    print(f"       goodput ecoserve / nodg = {row['goodput_ratio']:.2f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="prefill-heavy", help="prefill-heavy | decode-heavy | any tokenyard sim spec")
    p.add_argument("--instances", type=int, default=16)
    p.add_argument("--macro-size", type=int, default=4)
    p.add_argument("--profile", default="a100-llama3-8b")
    p.add_argument("--policy", default="least-loaded")
    p.add_argument("--rates", default="1,2,4,8", help="rate scales of the workload")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--ttft-ms", type=float, default=2000.0)
    p.add_argument("--tpot-ms", type=float, default=100.0)
    p.add_argument("--attainment", type=float, default=0.9)
    p.add_argument("--min-phase-s", type=float, default=1.0, help="EcoServe: shortest phase")
    p.add_argument("--stagger-s", type=float, default=1.0, help="EcoServe: interval between activations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.rates = [float(x) for x in args.rates.split(",")]
    out = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
