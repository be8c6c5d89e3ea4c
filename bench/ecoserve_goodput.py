"""EcoServe (partial disaggregation in time) against the baselines seed 002 names, on the
cluster simulator: same fleet, same requests, same SLOs (issue 13's figures).

    .venv/bin/python bench/ecoserve_goodput.py --workload coder|trace:PATH|… [--profile P]
        [--instances N] [--macro-size K] [--rates a,b,c] [--num-requests N]
        [--ttft-ms T] [--tpot-ms T] [--systems vllm,sarathi,distserve,ecoserve,ecoserve-pure,distserve-search]
        [--pd-prefill K] [--policy P] [--json FILE]

Systems (each what `tokenyard sim` runs with the flags shown):
  vllm           NoDG, no chunked prefill (vLLM as the seed ran it)   --mode nodg --no-chunked-prefill
  sarathi        NoDG, chunked prefill (vLLM V1's default)           --mode nodg
  distserve      spatial P/D, KV over the inter-node link            --mode pd [--pd-prefill K]
  distserve-search  spatial P/D, the best of every prefill/decode split per point (not in the
                 default set: it costs macro-size − 1 runs)         --mode pd --pd-prefill 1…K−1
  ecoserve       EcoServe, prefill phases mixing in the decodes      --mode ecoserve
  ecoserve-pure  EcoServe, prefill phases that prefill only (§2.2.1) --mode ecoserve --prefill-only-phases
Every system runs to the SLOs the goodput counts against (the fleet's engines and EcoServe's
controller get them). SLO attainment is of the requests offered: with flow control and
admission limits on (the product's defaults) an overloaded fleet refuses requests (429/503)
rather than queueing them without bound, and a refused request has missed its SLO.
Prints one row per (rate, system): throughput, goodput, SLO attainment, refused + expired,
TTFT and TPOT mean/p99, EcoServe filter fallbacks; EcoServe's goodput over each baseline's;
then the highest swept rate each keeps ≥ `--attainment` (90%) of requests within SLO.
Trace paths are arguments: nothing here names a file outside the repository.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.loadgen.workloads import open_workload  # noqa: E402
from tokenyard.services.router.core import RouterConfig  # noqa: E402
from tokenyard.simulator.cluster import ChainCache, SimConfig  # noqa: E402
from tokenyard.simulator.run import simulate  # noqa: E402

from bench._out import write_result  # noqa: E402

SYSTEMS = {
    "vllm": {"mode": "nodg", "chunked_prefill": False},
    "sarathi": {"mode": "nodg"},
    "distserve": {"mode": "pd"},
    "distserve-search": {"mode": "pd"},
    "ecoserve": {"mode": "ecoserve"},
    "ecoserve-pure": {"mode": "ecoserve", "prefill_only_phases": True},
}
DEFAULT_SYSTEMS = ("vllm", "sarathi", "distserve", "ecoserve", "ecoserve-pure")
BASELINES = ("vllm", "sarathi", "distserve", "distserve-search")
KEYS = ("request_throughput", "request_goodput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
        "prefix_hit_ratio", "preemptions")


def run(args) -> dict:
    goodput = {"ttft": args.ttft_ms, "tpot": args.tpot_ms}
    out: dict = {"workload": recorded(args.workload), "instances": args.instances, "macro_size": args.macro_size,
                 "profile": args.profile, "policy": args.policy, "slo_ms": goodput, "num_requests": args.num_requests,
                 "pd_prefill": args.pd_prefill, "max_model_len": args.max_model_len, "systems": args.systems,
                 "rows": []}
    for scale in args.rates:
        wl = open_workload(args.workload, num_requests=args.num_requests, rate_scale=scale, seed=args.seed)
        chains = ChainCache()
        offered = len(wl.items())
        row: dict = {"rate_scale": scale}
        for name in args.systems:
            cfg = SimConfig(instances=args.instances, profile=args.profile, policy=args.policy,
                            macro_size=args.macro_size, pd_prefill=args.pd_prefill,
                            max_model_len=args.max_model_len, **SYSTEMS[name])
            if name == "distserve-search":
                res, searched = pd_search(wl, cfg, goodput, chains, args.macro_size)
            else:
                res, searched = simulate(wl, cfg, goodput, chains), None
            done = res["request_goodput"] / res["request_throughput"] if res["request_throughput"] else 0.0
            out_all = res["outcomes"]["all"]
            row[name] = {k: res[k] for k in KEYS} | {
                "completed": res["completed"],
                "offered": offered,
                "attainment": done * res["completed"] / offered,
                "attainment_of_completed": done,
                "refused": out_all["refused"],
                "expired": out_all["expired"],
                "ecoserve_filter": res["ecoserve_filter"],
                "pd_handoffs": res["pd_handoffs"],
                "sim_speed": res.get("sim_speed"),
            } | ({"pd_search": searched} if searched else {})
            print_one(scale, name, row[name])
        for eco in ("ecoserve", "ecoserve-pure"):
            for base in BASELINES:
                if eco in row and base in row:
                    row[f"{eco}/{base}"] = row[eco]["request_goodput"] / max(row[base]["request_goodput"], 1e-9)
        print("       " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if "/" in k), flush=True)
        out["rows"].append(row)
    out["max_rate_scale"] = {}
    for name in args.systems:
        ok = [r["rate_scale"] for r in out["rows"] if r[name]["attainment"] >= args.attainment]
        out["max_rate_scale"][name] = max(ok) if ok else None
    print(f"highest swept rate scale with ≥ {args.attainment:.0%} within SLO: "
          + ", ".join(f"{k} {v}" for k, v in out["max_rate_scale"].items()), flush=True)
    return out


def pd_search(wl, cfg: SimConfig, goodput: dict, chains: ChainCache, macro_size: int) -> tuple[dict, dict]:
    """Spatial P/D with the prefill/decode split searched (DistServe searches its placement per
    workload): every split 1 … macro_size − 1 on these very requests, the best goodput kept.
    An oracle for the baseline — it is picked on the requests it is scored on."""
    runs = {k: simulate(wl, replace(cfg, pd_prefill=k), goodput, chains) for k in range(1, macro_size)}
    best = max(runs, key=lambda k: (runs[k]["request_goodput"], -k))
    return runs[best], {"pd_prefill": best, "goodput": {str(k): r["request_goodput"] for k, r in runs.items()}}


def recorded(spec: str) -> str:
    """The workload as the results record it: a trace by its file name (TRACE_DIR/NAME), so
    no path of the machine that ran it lands in the repository."""
    kind, _, path = spec.partition(":")
    return f"trace:TRACE_DIR/{Path(path).name}" if kind == "trace" else spec


def print_one(scale: float, name: str, r: dict) -> None:
    f = r["ecoserve_filter"]
    fb = f" fallbacks {f['fallbacks']}/{f['decisions']}" if f["decisions"] else ""
    print(f"x{scale:<5} {name:13} thr {r['request_throughput']:6.2f} good {r['request_goodput']:6.2f} "
          f"attain {r['attainment']:6.1%} refused {r['refused'] + r['expired']:5d} ttft {r['mean_ttft_ms']:7.0f}/{r['p99_ttft_ms']:7.0f} "
          f"tpot {r['mean_tpot_ms']:6.1f}/{r['p99_tpot_ms']:6.1f}{fb}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, help="chatbot | api | coder | trace:PATH (tokenyard sim's specs)")
    p.add_argument("--instances", type=int, default=16, help="simulated engine instances (default: %(default)s)")
    p.add_argument("--macro-size", type=int, default=4, help="workers per macro-instance (default: %(default)s)")
    p.add_argument("--profile", default="l20-codellama34b-tp4",
                   help="the simulator's latency profile, as tokenyard sim --profile takes it (default: %(default)s)")
    p.add_argument("--policy", default=RouterConfig().policy, help="routing policy (the router's default)")
    p.add_argument("--rates", default="0.1,0.2,0.3,0.4", help="rate scales of the workload")
    p.add_argument("--num-requests", type=int, default=2000, help="requests of the workload per run (default: %(default)s)")
    p.add_argument("--ttft-ms", type=float, default=3000.0,
                   help="time-to-first-token SLO, milliseconds (default: %(default)s)")
    p.add_argument("--tpot-ms", type=float, default=150.0,
                   help="time-per-output-token SLO, milliseconds (default: %(default)s)")
    p.add_argument("--attainment", type=float, default=0.9,
                   help="share of requests within SLO (0 to 1) a system needs at a rate to hold it, "
                        "for the highest-rate summary (default: %(default)s)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--pd-prefill", type=int, default=None, help="distserve: prefill workers per macro-instance")
    p.add_argument("--max-model-len", type=int, default=16384, help="CodeLlama-34B's context (vllm's unchunked budget)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's requests (default: %(default)s)")
    p.add_argument("--json", default=None, help="write the result as JSON to this file (default: not written)")
    args = p.parse_args()
    args.rates = [float(x) for x in args.rates.split(",")]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown system {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    out = run(args)
    write_result(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
