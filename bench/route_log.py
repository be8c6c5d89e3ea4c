"""The router's own view of its choices in a live run (`bench.live_router --route-log`): the
`route_choice` debug lines the router writes to the queue's log (services/router/shell.py), paired
with the bench's requests, summed into what the policy gave up against the best holder, and
tabled beside the engines' own prefix hits."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


def route_choices(path: Path, start: int) -> list[dict[str, Any]]:
    """The router's `route_choice` debug lines (services/router/shell.py) written to the
    queue's log from byte `start` on: one per offer, in the order the router made them."""
    out = []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for line in f:
                if b'"route_choice"' in line:
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(line))
    except OSError:
        pass
    return out


def placements(choices: list[dict[str, Any]], requests: list[dict[str, Any]]) -> None:
    """Put on each of the bench's requests where the router placed it (`--route-log`): the
    worker its last offer went to, the prefix tokens the router's index said that worker held
    (`hit`), the most any worker held (`best_hit`), the load and queued prefill the router saw
    there, how many offers it took and the workers that refused it (`refused_by`). The log
    names the edge's request ids, which the client does not see; a request is paired by its
    prompt tokens, in order: the router sees requests in arrival order give or take the few
    that overtake each other in the hops, and of two requests with the same prompt length
    the earlier is taken first."""
    waiting: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(requests, key=lambda r: r["index"]):
        waiting.setdefault(r["prompt_len"], []).append(r)
    paired: dict[str, dict[str, Any]] = {}
    for c in choices:
        req = paired.get(c.get("request_id"))
        if req is None:
            same = waiting.get(c.get("prompt_tokens"))
            if not same:
                continue
            req = paired[c["request_id"]] = same.pop(0)
        workers, hits = c.get("workers", []), c.get("hit", [])
        if c.get("worker") not in workers or not hits:
            continue
        if "worker" in req:  # an earlier offer of this request was refused
            req["refused_by"] = [*req.get("refused_by", []), req["worker"]]
        i = workers.index(c["worker"])
        req.update(worker=c["worker"], hit=hits[i], best_hit=max(hits), load=c["load"][i], queued=c["queued"][i],
                   notes=c.get("notes", []), offers=req.get("offers", 0) + 1)
        if "since_admitted_ms" in c:  # wall ms from admission to this offer: the queue's hold and the hops
            req["since_admitted_ms"] = c["since_admitted_ms"]


def served_lines(path: Path, start: int, worker: str) -> list[dict[str, Any]]:
    """A worker's `first_token` debug lines (services/worker/sim/engine.py: what its engine held
    when each request arrived and did with it) from byte `start` on, each named `worker`."""
    out = []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for line in f:
                if b'"first_token"' in line:
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(line) | {"worker": worker})
    except OSError:
        pass
    return out


def engine_placements(served: list[dict[str, Any]], requests: list[dict[str, Any]], peer: bool) -> None:
    """Put on each of the bench's requests what the engine that served it did (`--route-log`):
    the prefix tokens it found cached (`engine_hit`), its wall ms from arrival to the first
    token (`engine_ttft_ms`) and what it held when the request arrived (`engine_running`,
    `engine_waiting`, `engine_queued`: prompt tokens queued for prefill, whole and net of
    cached prefixes); behind a peer router (`peer`), also the worker and its hit. Paired as
    `placements` does, by prompt tokens in order, the workers' lines merged in the order the
    requests reached them."""
    waiting: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(requests, key=lambda r: r["index"]):
        waiting.setdefault(r["prompt_len"], []).append(r)
    for line in sorted(served, key=lambda x: x.get("arrived_s", 0.0)):
        same = waiting.get(line.get("prompt_tokens"))
        if not same:
            continue
        req = same.pop(0)
        req.update(engine_worker=line["worker"], engine_hit=line["cached_tokens"], engine_ttft_ms=line["ttft_ms"],
                   engine_running=line.get("running"), engine_waiting=line.get("waiting"),
                   engine_queued=[line.get("queued_prefill"), line.get("queued_prefill_net")])
        if peer:
            req.update(worker=line["worker"], hit=line["cached_tokens"])


def choice_summary(choices: list[dict[str, Any]]) -> dict[str, Any]:
    """What the router's own view said about its choices (`--route-log`), each request's last
    offer (the one its worker took): the prefix tokens it expected on the chosen workers
    (`chosen_hit`), the most any worker held by its index (`best_hit`: their difference is
    what the policy gave up), and the choices that took a request away from the worker
    holding most of it, largest first."""
    last = {c.get("request_id"): c for c in choices}  # a refused offer's request went to its next one
    chosen = best = 0
    away = []
    for c in last.values():
        hits, workers = c.get("hit", []), c.get("workers", [])
        if not hits or c.get("worker") not in workers:
            continue
        mine, top = hits[workers.index(c["worker"])], max(hits)
        chosen, best = chosen + mine, best + top
        if top > mine:
            away.append({k: c.get(k) for k in ("request_id", "prompt_tokens", "worker", "notes", "workers", "hit",
                                               "load", "queued")} | {"lost": top - mine})
    away.sort(key=lambda a: -a["lost"])
    return {"offers": len(choices), "chosen_hit": chosen, "best_hit": best, "away": away}


def route_table(doc: dict[str, Any]) -> str:
    """Where the prefix hits went (`--route-log` runs): of the prompt tokens the engines were
    asked for (their prefix-cache queries), the share the router's index said the chosen
    workers held, the share the best-holding workers held (their difference is what the policy
    traded for load), and the share the engines found (below the router's: blocks it counted
    that the engine no longer had, or re-offers counted twice)."""
    out = ["| round | load | router | offers | chosen workers' hit (router's view) | best holders' hit | "
           "engines' hit | taken from the best holder |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        rc = r.get("route_choices")
        if not rc or not rc["offers"]:  # no log line: a baseline whose router does not write them
            continue
        fm = r.get("fleet_metrics", {})
        queries = sum(v for k, v in fm.items() if k.startswith("vllm:prefix_cache_queries_total"))
        hits = sum(v for k, v in fm.items() if k.startswith("vllm:prefix_cache_hits_total"))
        shares = [f"{x / queries:.3f}" if queries else "–" for x in (rc["chosen_hit"], rc["best_hit"], hits)]
        out.append(f"| {r.get('round', 1)} | ×{r['load']:g} | {r['router']} | {rc['offers']} | "
                   f"{' | '.join(shares)} | {len(rc['away'])} |")
    return "\n".join(out)
