"""Fingerprints of fixed simulations: a refactor of the simulated engine or the simulator's
event loop that claims "behaviour unchanged" is checked by comparing them before and after.

    python -m bench.sim_fingerprint [--only NAME,...] [--json FILE] [--check FILE]

Each run's fingerprint is a SHA-256 over everything it produced, floats by their exact repr:
  cluster runs  every request's token times, finish, error, cached tokens and worker, and the
                result dict (simulator.metrics.result) without its wall-clock keys
  engine runs   one SimEngineCore stepped alone on a virtual clock: every output (request,
                tokens, finish) at its time, every KV event, the final stats
The runs (each a few seconds to a minute on a loaded 2-core machine):
  mooncake      `tokenyard sim --workload mooncake --num-requests 500` (16 instances, defaults)
  mooncake-128  the first 300 Mooncake requests on 128 instances (the sim_speed shape)
  chatbot       chatbot, 400 requests, 8 instances, the P0..P3 mix 0.1,0.4,0.3,0.2
  ecoserve      chatbot, 400 requests, 16 instances, macro-instances of 4, mode ecoserve
  pd            chatbot, 300 requests, 8 instances, macro-instances of 4, mode pd
  engine-<p>    one engine under policy p (vllm, scorpio, priority-kv, scorpio+kv): 300
                requests of mixed classes and TPOT SLOs, KV tight enough to preempt, a host
                tier with swap preemption
`--check FILE` exits 1 when any fingerprint differs from FILE's (names missing there are
only reported). Determinism means the same code gives the same fingerprints on any machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine_policies import make_engine_policy
from tokenyard.services.worker.sim.latency import profile as get_profile
from tokenyard.services.worker.sim.replay import replay
from tokenyard.shared import hashing
from tokenyard.shared.schemas import AdmittedRequest
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig, with_slos
from tokenyard.simulator.metrics import WALL_CLOCK_KEYS, result

from bench._out import write_result

GOODPUT_MS = {"ttft": 2000.0, "tpot": 100.0}

CLUSTER_RUNS = {
    "mooncake": (dict(spec="mooncake", num_requests=500), SimConfig()),
    "mooncake-128": (dict(spec="mooncake", num_requests=300), SimConfig(instances=128)),
    "chatbot": (dict(spec="chatbot", num_requests=400, priority_mix=(0.1, 0.4, 0.3, 0.2)), SimConfig(instances=8)),
    "ecoserve": (dict(spec="chatbot", num_requests=400), SimConfig(instances=16, macro_size=4, mode="ecoserve")),
    "pd": (dict(spec="chatbot", num_requests=300), SimConfig(instances=8, macro_size=4, mode="pd")),
}
ENGINE_POLICIES = ("vllm", "scorpio", "priority-kv", "scorpio+kv")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def cluster_run(name: str) -> dict:
    spec, cfg = CLUSTER_RUNS[name]
    spec = dict(spec)
    w = open_workload(spec.pop("spec"), **spec)
    items = w.items()
    sim = ClusterSim(with_slos(cfg, GOODPUT_MS), w.block_tokens, ChainCache())
    sim.run(items)
    res = {k: v for k, v in result(sim, items, GOODPUT_MS).items() if k not in WALL_CLOCK_KEYS}
    per_req = [
        (rid, [repr(t) for t in st.tokens], st.finished, st.error, st.cached_tokens, st.worker, st.expired)
        for rid, st in sorted(sim.reqs.items())
    ]
    return {"fingerprint": _digest([per_req, res]), "sim_time_s": sim.now, "wall_s": sim.wall_s,
            "completed": res.get("completed")}


def _engine_requests(n: int, seed: int = 0) -> list[AdmittedRequest]:
    rng = np.random.default_rng(seed)
    bs = 16
    arrivals = np.cumsum(rng.exponential(1 / 12.0, size=n))
    shared = [list(range(1_000_000 * (p + 1), 1_000_000 * (p + 1) + 512)) for p in range(4)]
    reqs = []
    for i in range(n):
        prefix = shared[int(rng.integers(4))][: int(rng.integers(0, 512))]
        own = [int(x) for x in rng.integers(0, 50_000, size=int(np.clip(rng.lognormal(math.log(300), 0.9), 8, 3000)))]
        toks = prefix + own
        out = int(np.clip(rng.lognormal(math.log(150), 0.7), 4, 800))
        reqs.append(AdmittedRequest(
            f"e{i}", "", "m", toks, len(toks), hashing.hash_chain(toks, bs), bs, out, int(rng.integers(0, 4)),
            float(arrivals[i]), tpot_slo_ms=float(rng.choice([50.0, 100.0, 200.0])),
        ))
    return reqs


def engine_run(policy: str) -> dict:
    prof = get_profile("a100-llama3-8b")
    core = SimEngineCore(prof, 16, 1200, host_blocks=400, preemption_mode="swap",
                         policy=make_engine_policy(policy, prof))
    reqs = _engine_requests(300)
    trace: list = []
    now = 0.0
    wall0 = time.perf_counter()
    for now, expired, res in replay(core, reqs):
        trace.append((repr(now), expired, [(o.request_id, o.new_token_ids, o.finished, o.finish_reason,
                                            o.num_cached_tokens) for o in res.outputs],
                      [repr(e) for e in core.pool.drain_events()]))
    trace.append(repr(core.stats()))
    return {"fingerprint": _digest(trace), "sim_time_s": now, "wall_s": time.perf_counter() - wall0,
            "completed": sum(1 for t in trace[:-1] for o in t[2] if o[3] == "length")}


RUNS = {**{n: (cluster_run, n) for n in CLUSTER_RUNS}, **{f"engine-{p}": (engine_run, p) for p in ENGINE_POLICIES}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_fingerprint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, metavar="NAME,...", help=f"a subset of: {', '.join(RUNS)}")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the fingerprints here")
    ap.add_argument("--check", default=None, metavar="FILE", help="compare with the fingerprints in FILE")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        ap.error(f"unknown run(s) {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    want = json.loads(Path(args.check).read_text()) if args.check else {}
    out, differ = {}, []
    for name in names:
        fn, arg = RUNS[name]
        out[name] = fn(arg)
        verdict = ""
        if name in want:
            same = want[name]["fingerprint"] == out[name]["fingerprint"]
            verdict = "same" if same else "DIFFERS"
            if not same:
                differ.append(name)
        elif args.check:
            verdict = "(not in the reference)"
        r = out[name]
        print(f"{name:22} {r['fingerprint'][:16]}  sim {r['sim_time_s']:9.1f} s  wall {r['wall_s']:6.1f} s  {verdict}",
              flush=True)
    write_result(args.json, out)
    if differ:
        print(f"differs from {args.check}: {', '.join(differ)}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
