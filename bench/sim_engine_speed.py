"""How fast the simulated engine steps, on one core: steps per wall second and simulated
seconds per wall second for representative batches, and the real-time multiple that implies
for a cluster simulator driving N instances on one core (= sim seconds per wall second ÷ N,
the engines' share only: routing, queueing and metrics come on top).

    .venv/bin/python bench/sim_engine_speed.py [--instances 128] [--seconds 2] [--json FILE]

Scenarios (A100 Llama-3-8B profile unless named):
  decode-32 / decode-128  a steady batch of 32 / 128 requests decoding (1k-token prompts,
                          a finished request replaced at once by a new one: its prefill mixes in)
  chat-mixed              Poisson arrivals at 4 req/s, prompts 200–4000 tokens sharing system
                          prompts, 50–500 tokens out: chunked prefill, prefix hits, decodes
  mooncake                one instance's share (1/16) of the Mooncake conversation trace at its
                          own rate, 512-token blocks, ids as hashes (data/traces)
Each runs `step()` one at a time, then with `advance()` (identical decode steps folded).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenyard.data import TRACES  # noqa: E402
from tokenyard.services.worker.sim.core import SimEngineCore  # noqa: E402
from tokenyard.services.worker.sim.latency import PROFILES  # noqa: E402
from tokenyard.shared.hashing import ids_chain  # noqa: E402
from tokenyard.shared.schemas import AdmittedRequest  # noqa: E402

from bench._out import write_result  # noqa: E402

TRACE = TRACES / "mooncake_conversation_trace.jsonl.gz"


def _req(rid: str, prompt_len: int, ids: list[int], max_tokens: int, bs: int) -> AdmittedRequest:
    return AdmittedRequest(rid, "", "m", [], prompt_len, ids_chain(ids)[: prompt_len // bs], bs, max_tokens, 1, 0.0)


def steady(batch: int):
    def arrivals():
        k = 0
        while True:
            yield None, _req(f"s{k}", 1024, list(range(k * 64, k * 64 + 64)), 256 + (k * 37) % 512, 16)
            k += 1
    return 16, arrivals(), batch


def chat_mixed():
    rng = random.Random(7)

    def arrivals():
        t, k = 0.0, 0
        while True:
            t += rng.expovariate(4.0)
            system = rng.randrange(8)
            n = rng.randint(200, 4000)
            ids = [10**6 + system * 1000 + j for j in range(32)] + list(range(k * 300, k * 300 + 300))
            yield t, _req(f"c{k}", n, ids, rng.randint(50, 500), 16)
            k += 1
    return 16, arrivals(), None


def mooncake():
    def arrivals():
        with gzip.open(TRACE, "rt") as f:
            for k, line in enumerate(f):
                if k % 16:
                    continue
                row = json.loads(line)
                yield row["timestamp"] / 1000.0, _req(f"m{k}", row["input_length"], row["hash_ids"],
                                                     max(1, row["output_length"]), 512)
    return 512, arrivals(), None


def run(scenario, wall_s: float, fold: bool, prepare: int = 4000) -> dict:
    """Requests (and their hash chains) are made before the clock starts: the engine alone is timed."""
    bs, arrivals, batch = scenario
    arrivals = iter([a for a, _ in zip(arrivals, range(prepare), strict=False)])
    core = SimEngineCore(PROFILES["a100-llama3-8b"], bs)
    now = 0.0
    steps = calls = 0
    pending = next(arrivals, None)
    t0 = time.perf_counter()
    deadline = t0 + wall_s
    while True:
        if batch is not None:  # closed loop: keep `batch` requests in
            while len(core.seqs) < batch and pending is not None:
                core.add(pending[1])
                pending = next(arrivals, None)
            horizon = float("inf")
        else:
            while pending is not None and pending[0] <= now:
                core.add(pending[1])
                pending = next(arrivals, None)
            horizon = (pending[0] - now) if pending is not None else float("inf")
        if not core.has_work():
            if pending is None:
                break
            now = pending[0]
            continue
        if fold:
            r = core.advance(horizon)
        else:
            r = core.step()
        now += r.duration_s
        steps += r.num_steps
        calls += 1
        if calls % 64 == 0 and time.perf_counter() > deadline:
            break
    wall = time.perf_counter() - t0
    return {"steps": steps, "calls": calls, "wall_s": round(wall, 3), "sim_s": round(now, 3),
            "steps_per_s": round(steps / wall), "sim_s_per_wall_s": round(now / wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=128,
                    help="instances one core would drive, for the real-time multiple column (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=2.0, help="wall seconds per scenario and mode")
    ap.add_argument("--json", type=Path, help="write the results as JSON to this file (default: not written)")
    args = ap.parse_args(argv)
    scenarios = {"decode-32": lambda: steady(32), "decode-128": lambda: steady(128), "chat-mixed": chat_mixed}
    scenarios["mooncake"] = mooncake
    results = {}
    print(f"{'scenario':<12} {'mode':<8} {'steps/s':>9} {'sim s/wall s':>13} {'x real time @' + str(args.instances):>18}")
    for name, make in scenarios.items():
        for fold in (False, True):
            r = run(make(), args.seconds, fold)
            r["realtime_multiple_at_instances"] = round(r["sim_s_per_wall_s"] / args.instances, 2)
            mode = "advance" if fold else "step"
            results[f"{name}/{mode}"] = r
            print(f"{name:<12} {mode:<8} {r['steps_per_s']:>9} {r['sim_s_per_wall_s']:>13} "
                  f"{r['realtime_multiple_at_instances']:>18}")
    write_result(args.json, {"instances": args.instances, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
