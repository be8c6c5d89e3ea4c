"""The router's decision hot path against another commit's, paired in one process.

    python -m bench.decision_paired --baseline 1c0980c [--instances 256] [--blocks 1000000]

`tokenyard bench router`'s setup (its fleet and its Mooncake-filled index) is built once with
this tree's code; REF's `services/router/index.py`, `pipeline.py`, `filters.py`,
`policies/latency.py` and `core.py` (taken with `git show`) are loaded beside this tree's as
modules of their own: REF's BlockIndex is given this index's state, REF's Pipeline REF's own
filters, guards, scorer and picker, and REF's `RouterCore.route` runs on this core's state
(its fleet view, detector and row map). Then each of `--requests` trace requests is timed by
both, in alternating order, `--repeats` times; a decision's figure is its least thread CPU
time (the floor, as `bench router` reports it). Both sides see the same index, fleet and
moments, so on a loaded machine the difference is the code's. The answers are checked equal
first (route: the worker, its score and hit; match: every slot's hit; choose: the worker and
its score; the scorer: every score).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FILES = ("index", "pipeline", "filters", "policies/latency", "core")


def load_ref(ref: str, tmp: Path) -> dict:
    """REF's router modules, as `ref_index`, `ref_pipeline`, `ref_filters`, `ref_latency` (the
    default policy's scorer and bounded-load guard), `ref_core` (RouterCore.route's own steps)."""
    mods = {}
    for name in FILES:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:services/router/{name}.py"],
                              capture_output=True, text=True, check=True).stdout
        short = name.rsplit("/", 1)[-1]
        path = tmp / f"ref_{short}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"ref_{short}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        mods[short] = mod
    return mods


def paired(f_ref, f_this, reqs, repeats: int, after=None) -> tuple[np.ndarray, np.ndarray]:
    """Each request's least thread CPU time by either side; `after()` (untimed) runs after
    each call: it undoes what a call changed, so both sides see the same state."""
    ref, this = np.full(len(reqs), np.inf), np.full(len(reqs), np.inf)
    clock = time.thread_time_ns
    for rep in range(repeats):
        for j, req in enumerate(reqs):
            order = ((f_ref, ref), (f_this, this)) if (j + rep) % 2 else ((f_this, this), (f_ref, ref))
            for f, floor in order:
                t0 = clock()
                f(req)
                floor[j] = min(floor[j], clock() - t0)
                if after is not None:
                    after()
    return ref / 1e3, this / 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decision_paired", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, metavar="REF", help="the commit to compare with")
    p.add_argument("--instances", type=int, default=256, help="simulated workers in the router's fleet (default: %(default)s)")
    p.add_argument("--blocks", type=int, default=1_000_000,
                   help="KV-cache blocks the router's index is filled with before timing (default: %(default)s)")
    p.add_argument("--requests", type=int, default=2000, help="trace requests timed by both sides (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
                   help="times each request is timed per side; the least time counts (default: %(default)s)")
    args = p.parse_args(argv)

    from tokenyard.loadgen import router_bench
    from tokenyard.services.router import core as router_core
    from tokenyard.shared.schemas import AdmittedRequest

    built = []
    init = router_core.RouterCore.__init__

    def keep(self, cfg):  # the core bench router builds, with its index and fleet
        init(self, cfg)
        built.append(self)

    router_core.RouterCore.__init__ = keep
    router_bench.run_router_bench(args.instances, blocks=args.blocks, decisions=10, repeats=1)
    router_core.RouterCore.__init__ = init
    core = built[0]
    chains = router_bench.load_chains(router_bench.TRACE, 16)
    skip = len(chains) // 2  # past what filled the index
    reqs = [AdmittedRequest(f"p{k}", "", router_bench.MODEL, [], plen, chain, 16, olen, 1, 0.0)
            for k, (plen, olen, chain) in enumerate(chains[skip: skip + args.requests])]
    now = 1e6
    view = core.view
    view.seen_s[: view.n] = now  # every row fresh
    view.rows_written()
    with tempfile.TemporaryDirectory() as tmp:
        ref = load_ref(args.baseline, Path(tmp))
    ref_index = ref["index"].BlockIndex(core.index.max_blocks)
    ref_index.__dict__.update(core.index.__dict__)
    this_pipe = core.pipeline
    rf, rl = ref["filters"], ref["latency"]
    ref_pipe = ref["pipeline"].Pipeline(
        this_pipe.name, [rf.HealthyFilter(core.cfg.stale_after_s), rf.AcceptingFilter(), rf.ModelFilter(),
                         rf.VbsFilter(), *this_pipe.filters[4:]],
        rl.MarginalLatencyScorer(), ref["pipeline"].ArgminPicker(), [rf.EcoServeGuard(refused={}), rl.BoundedLoadGuard()])
    assert [g.name for g in ref_pipe.guards] == [g.name for g in this_pipe.guards], "compare like with like"
    everyone = np.arange(view.n)

    # A whole decision (RouterCore.route: index match, the vector steps, the pipeline, the
    # optimistic update), REF's index and pipeline in this tree's core; what a decision writes
    # into the fleet view is put back after each, so every decision sees the same fleet.
    ref_core = copy.copy(core)
    ref_core.__class__ = ref["core"].RouterCore  # REF's route, on this core's state
    ref_core.index, ref_core.pipeline = ref_index, ref_pipe
    routed_cols = tuple(c for c in ("waiting", "load", "bs", "queued_prefill", "kv_used", "last_chosen") if hasattr(view, c))
    saved = {c: getattr(view, c).copy() for c in routed_cols}
    decisions = view.decisions

    def put_back() -> None:
        for c in routed_cols:
            getattr(view, c)[:] = saved[c]
        view.decisions = decisions

    cases = {
        "route (whole)": (lambda r: ref_core.route(r, now), lambda r: core.route(r, now),
                          lambda a, b: (a.worker_id, a.score, a.hit_tokens) == (b.worker_id, b.score, b.hit_tokens)),
        "index match": (lambda r: ref_index.match(r.block_hashes, pad=1),
                        lambda r: core.index.match(r.block_hashes, pad=1),
                        lambda a, b: bool((a == b).all())),
        "pipeline choose": (lambda r: ref_pipe.choose(r, view, now), lambda r: this_pipe.choose(r, view, now),
                            lambda a, b: (a.worker_id, a.score) == (b.worker_id, b.score)),
        "scorer (all rows)": (lambda r: ref_pipe.scorer.score(r, view, everyone).scores,
                              lambda r: this_pipe.scorer.score(r, view, everyone).scores,
                              lambda a, b: bool((a == b).all())),
    }
    gc.collect()
    gc.freeze()
    print(f"{args.instances} instances, {len(core.index):,} blocks, {len(reqs)} requests × {args.repeats} "
          f"(floor µs; {args.baseline} | this tree); load average {os.getloadavg()[0]:.1f}")
    for name, (f_ref, f_this, same) in cases.items():
        after = put_back if name == "route (whole)" else (lambda: None)
        for r in reqs:
            a = f_ref(r)
            after()
            b = f_this(r)
            after()
            if not same(a, b):
                print(f"{name}: the answers differ")
                return 1
        a, b = paired(f_ref, f_this, reqs, args.repeats, after)
        cells = " | ".join(f"p{q} {np.percentile(a, q):6.1f} {np.percentile(b, q):6.1f}" for q in (50, 90, 99))
        print(f"  {name:16s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
