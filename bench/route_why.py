"""Why the live default took requests away from the worker holding most of their prefix: the
router's `route_choice` debug lines (`bench.live_router --route-log` writes them to the
queue's log) replayed through the default's guard (services/router/policies/latency.py).

    python -m bench.route_why QUEUE_LOG [--skip N] [--offers N]

For each request whose last offer went to a worker holding less of it than the best holder
(by the router's own index), one reason, the first that applies:

* `refused`: the holder was offered the request and refused it (a worker's flow-control
  refusal, `saturated`: its prefill backlog beyond its decodes' TPOT slack);
* `within the bound`: the holder was within the bound and the scorer priced it higher;
* `queue >= hit`: the holder was beyond the bound, L_i + 1 > ⌈c·(ΣL + 1)/n⌉, and not exempt
  because its queued prefill was at least what r has cached there (hit_i ≤ Q_i);
* `sooner elsewhere`: beyond the bound, hit_i > Q_i, but r's first token would come later
  there than within the bound (the exemption's own comparison, latency.exempt_cost);
* `exempt`: exempt, and the scorer priced it higher.

A line's load and queue on the chosen worker already count the request (the router's
optimistic update); they are taken back before the bound is recomputed. `--skip` / `--offers`
select one run of a log that holds several (bench.live_router appends: its JSON's
`route_choices.offers` of each run, in order).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenyard.services.router.policies.latency import BALANCE_FACTOR, exempt_cost


def reason(offers: list[dict[str, Any]]) -> tuple[int, str] | None:
    """(prefix tokens given up, why) for one request's offers in order; None if its last
    offer went to a best holder."""
    last = offers[-1]
    workers, hit = last["workers"], last["hit"]
    k, best = workers.index(last["worker"]), max(hit)
    if best <= hit[k]:
        return None
    lost, holder = best - hit[k], hit.index(best)
    if any(o["worker"] == workers[holder] for o in offers[:-1]):
        return lost, "refused"
    plen = last["prompt_tokens"]
    load, queued = list(last["load"]), list(last["queued"])
    load[k] -= 1
    queued[k] -= max(plen - hit[k], 1)
    refused = {o["worker"] for o in offers[:-1]}
    cand = [i for i, w in enumerate(workers) if w not in refused]
    if not cand:  # a re-asked request whose offers had covered every worker
        return lost, "refused"
    cap = math.ceil(BALANCE_FACTOR * (sum(load[i] for i in cand) + 1) / len(cand))
    within = [i for i in cand if load[i] < cap]
    if holder in within:
        return lost, "within the bound"
    if hit[holder] <= queued[holder]:
        return lost, "queue >= hit"
    cost = [exempt_cost(queued[i], max(plen - hit[i], 1)) for i in range(len(workers))]
    if cost[holder] > min(cost[i] for i in within):
        return lost, "sooner elsewhere"
    return lost, "exempt"


def reasons(choices: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """why → (requests, prefix tokens given up), over every request of `choices`."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in choices:
        by[c["request_id"]].append(c)
    count: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for offers in by.values():
        r = reason(offers)
        if r is not None:
            count[r[1]] += 1
            tokens[r[1]] += r[0]
    return {k: (count[k], tokens[k]) for k in count}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="the queue's log of a --route-log run (LOG_DIR/tokenyard/queue.log)")
    ap.add_argument("--skip", type=int, default=0, help="choice lines of earlier runs to skip")
    ap.add_argument("--offers", type=int, default=None, help="choice lines of this run (default: the rest)")
    args = ap.parse_args()
    lines = [json.loads(line) for line in args.log.open("rb") if b'"route_choice"' in line][args.skip:]
    if args.offers is not None:
        lines = lines[: args.offers]
    print("| why | requests | prefix tokens given up |\n|---|---:|---:|")
    for why, (n, tokens) in sorted(reasons(lines).items(), key=lambda kv: -kv[1][1]):
        print(f"| {why} | {n} | {tokens} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
