"""A `vllm bench serve --max-concurrency C` run against the simulated engine, on a virtual
clock: C clients each send a request (random prompt of `input_len` tokens, no shared prefix,
exactly `output_len` tokens out), and send the next as soon as theirs finishes, until
`num_prompts` are done. Outputs arrive at the end of the step that made them.

    TTFT = first token − sent;   TPOT = (last token − first token) / (output_len − 1)

Used to calibrate (the MoE profile's two efficiencies) and to check profiles against
published serving benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.latency import LatencyProfile
from tokenyard.shared.hashing import ids_chain
from tokenyard.shared.schemas import AdmittedRequest


@dataclass
class ClosedLoopResult:
    mean_ttft_ms: float
    mean_tpot_ms: float
    duration_s: float
    steps: int


def run(prof: LatencyProfile, concurrency: int, input_len: int, output_len: int, num_prompts: int,
        block_size: int = 16) -> ClosedLoopResult:
    core = SimEngineCore(prof, block_size)
    now = 0.0
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    ttft: list[float] = []
    tpot: list[float] = []
    nxt = 0
    per_prompt = -(-input_len // block_size)

    def submit() -> None:
        nonlocal nxt
        rid = f"r{nxt}"
        ids = range(nxt * per_prompt, (nxt + 1) * per_prompt)
        core.add(AdmittedRequest(rid, "", "m", [], input_len, ids_chain(ids)[: input_len // block_size],
                                 block_size, output_len, 1, now))
        sent[rid] = now
        nxt += 1

    for _ in range(min(concurrency, num_prompts)):
        submit()
    steps = 0
    while core.has_work():
        r = core.step()
        steps += 1
        now += r.duration_s
        for o in r.outputs:
            if o.request_id not in first:
                first[o.request_id] = now
                ttft.append(now - sent[o.request_id])
            if o.finished:
                if output_len > 1:
                    tpot.append((now - first[o.request_id]) / (output_len - 1))
                if nxt < num_prompts:
                    submit()
    return ClosedLoopResult(
        mean_ttft_ms=1000.0 * sum(ttft) / len(ttft),
        mean_tpot_ms=1000.0 * sum(tpot) / len(tpot) if tpot else 0.0,
        duration_s=now,
        steps=steps,
    )
