"""The simulated engine's policy seam (scheduler.SchedulingPolicy): the optional hooks are
declared on the Protocol with vLLM's behaviour as their defaults, the engine calls them
directly, a wrapping policy passes them through, and claimed victims come back from the
policy for the engine to preempt. Also: the engine's stats are recomputed after any change."""

from __future__ import annotations

from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.kv_priority import PriorityKVPolicy
from tokenyard.services.worker.sim.latency import PROFILES
from tokenyard.services.worker.sim.scheduler import KeyedLine, SchedulingPolicy, VllmPolicy, priority_key
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy
from tokenyard.shared.schemas import AdmittedRequest

from tests import builders

BS = 16
A100 = PROFILES["a100-llama3-8b"]


def req(k: int, prompt: int, out: int, priority: int = 1, tpot: float = 0.0) -> AdmittedRequest:
    toks = [10_000 * k + j for j in range(prompt)]
    return builders.req(f"r{k}", max_tokens=out, priority=priority, tokens=toks, block_size=BS, reply_to="",
                        tpot_slo_ms=tpot)


class OnlyTheRequired(SchedulingPolicy):
    """A policy that declares the two hooks without a default and inherits the rest."""

    def new_waiting_line(self) -> KeyedLine:
        return KeyedLine(priority_key)

    def admit(self, seq, core) -> bool:
        return True


def run(policy: SchedulingPolicy, reqs: list[AdmittedRequest], blocks: int = 400) -> list:
    core = SimEngineCore(A100, BS, blocks, policy=policy)
    for r in reqs:
        core.add(r)
    trace = []
    while core.has_work():
        res = core.step()
        trace.append((res.duration_s, [(o.request_id, o.new_token_ids, o.finish_reason) for o in res.outputs],
                      core.stats()))
    return trace


def test_a_policy_inherits_vllms_behaviour_for_every_hook_it_leaves_out():
    reqs = [req(k, 100 + 37 * k, 150 + 20 * k, priority=k % 3) for k in range(8)]
    p = OnlyTheRequired()
    assert p.due_victims(None) == () and p.heartbeat_fields(None) == {} and p.rejects_past_deadline is False
    assert run(p, reqs, blocks=60) == run(VllmPolicy(), reqs, blocks=60)  # tight: preemptions happen too
    assert run(p, reqs, blocks=60)[-1][2].preemptions > 0


def test_the_kv_regions_pass_scorpios_hooks_through():
    reqs = [req(k, 200, 30, tpot=50.0 if k % 2 else 150.0) for k in range(6)]
    alone, wrapped = run(ScorpioPolicy(A100), reqs), run(PriorityKVPolicy(ScorpioPolicy(A100)), reqs)
    assert alone == wrapped  # one class, room for all: the regions change nothing
    vbs = [s.vbs for _, _, s in alone if s.running]
    assert vbs and all(0 < v <= 6 for v in vbs)  # the heartbeat fields came through
    assert all(s.vbs == 0.0 for _, _, s in run(PriorityKVPolicy(), reqs))  # vLLM's inside: none
    # the token budget came through too: the tight SLO caps a step below the full budget
    core = SimEngineCore(A100, BS, 400, policy=PriorityKVPolicy(ScorpioPolicy(A100)))
    for r in reqs:
        core.add(r)
    while not any(s.computed >= s.target for s in core.running):
        core.step()
    assert core.policy.token_budget(core) < A100.max_num_batched_tokens


def test_claimed_victims_come_back_from_the_policy_and_the_engine_preempts_them():
    core = SimEngineCore(A100, BS, 100, policy=PriorityKVPolicy())
    for k in range(3):  # low-class requests fill the pool
        core.add(req(k, 480, 200, priority=3))
    while core.waiting:
        core.step()
    core.add(req(9, 600, 10, priority=0))  # a P0 claims room from them
    core.step()  # admission marks victims; they finish this step
    victims = list(core.policy.marked)
    assert victims and all(v.req.priority == 3 for v in victims)
    assert all(v.running for v in victims)
    before = core.preemptions
    core.step()  # the policy returns them (due_victims); the engine preempts, then admits the P0
    assert core.preemptions == before + len(victims) and not core.policy.marked
    assert any(s.rid == "r9" for s in core.running)


def test_stats_follow_every_change_of_the_engine():
    core = SimEngineCore(A100, BS, 100)
    idle = core.stats()
    assert core.stats() is idle  # nothing changed: the same numbers
    core.add(req(1, 64, 3))
    assert core.stats().waiting == 1 and core.stats().queued_prefill_tokens == 64
    core.step()
    s = core.stats()
    assert s.running == 1 and s.waiting == 0 and s.kv_blocks_used > 0
    core.abort("r1")
    assert core.stats().running == 0 and core.stats().kv_blocks_used < s.kv_blocks_used + 1
    core.step()  # the abort's output goes out
    assert core.stats().compute_util == 0.0
