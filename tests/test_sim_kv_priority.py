"""KV memory by priority in the simulated engine (services/worker/sim/kv_priority.py):
reclaiming blocks from lower classes after their step, entitlements, victim order, and the
class-ordered waiting line."""

from __future__ import annotations

from tokenyard.services.worker.sim.core import Seq, SimEngineCore
from tokenyard.services.worker.sim.kv_priority import PriorityKVPolicy, Regions
from tokenyard.services.worker.sim.latency import profile
from tokenyard.services.worker.sim.scorpio import ScorpioPolicy

from tests.test_sim_scorpio import areq

PROF = profile("a100-llama3-8b")


def full_engine(cls: int = 3, n: int = 7, policy: PriorityKVPolicy | None = None):
    """40 blocks; n requests of class `cls` hold 5 blocks each after one step."""
    pol = policy or PriorityKVPolicy()
    core = SimEngineCore(PROF, 16, num_blocks=40, policy=pol)
    for i in range(n):
        core.add(areq(f"c{cls}-{i}", prompt=80, out=40, prio=cls, arrival=float(i)))
    core.step()
    return core, pol


def rids(seqs) -> list[str]:
    return [s.rid for s in seqs]


def test_p0_reclaims_from_p3_after_the_victims_step():
    core, pol = full_engine()
    assert core.pool.available == 5
    core.add(areq("p0", prompt=160, out=4, prio=0, arrival=10.0))  # needs 10 blocks
    core.step()
    # the core's own growth preempted the newest P3; a step that preempted admits nobody (vLLM)
    assert core.preemptions == 1 and pol.marked == [] and rids(core.waiting.ordered()) == ["p0", "c3-6"]
    core.step()
    # P0's claim marked the next newest
    assert rids(pol.marked) == ["c3-5"] and "c3-5" in rids(core.running)
    assert rids(core.waiting.ordered()) == ["p0", "c3-6"]  # P0 heads the class-ordered line
    core.step()  # c3-5 finished its step; now it is preempted and P0 joins
    assert rids(core.running) == ["c3-0", "c3-1", "c3-2", "c3-3", "c3-4", "p0"]
    assert rids(core.waiting.ordered()) == ["c3-5", "c3-6"]  # preempted first within its class
    assert pol.reclaims == 1 and pol.marked == []


def test_p1_reclaims_only_within_its_elastic_region_and_never_from_p0():
    core, pol = full_engine(cls=0)  # P0 holds 35 of 40 blocks (over its 40% ceiling: no matter)
    core.add(areq("p1", prompt=160, prio=1, arrival=10.0))
    core.step()
    core.step()  # (the first step's growth preempted: it admitted nobody, vLLM's rule)
    assert pol.marked == [] and "p1" in rids(core.waiting)
    core2, pol2 = full_engine(cls=2)
    core2.add(areq("p1", prompt=160, prio=1, arrival=10.0))  # 10 ≤ 35% of 40 = 14: may reclaim
    core2.step()
    assert core2.preemptions == 1 and pol2.marked == []  # growth preempted: no admission this step
    core2.step()
    assert len(pol2.marked) == 1 and pol2.marked[0].req.priority == 2


def test_beyond_its_ceiling_p0_gets_only_free_blocks():
    pol = PriorityKVPolicy(regions=Regions(p0_floor=0.1, p0_ceiling=0.2, p1_share=0.3))
    core, _ = full_engine(policy=pol)
    core.add(areq("p0", prompt=160, prio=0, arrival=10.0))  # 10 blocks > 20% of 40
    core.step()
    assert pol.marked == [] and pol.reclaims == 0


def test_claims_take_victims_by_the_engines_one_rule_lowest_class_then_latest_arrival():
    core, pol = full_engine(cls=2, n=4)  # c2-0..c2-3 hold 20 blocks
    for i in range(3):
        core.add(areq(f"c3-{i}", prompt=80, out=40, prio=3, arrival=10.0 + i))
    core.step()  # 35 of 40 blocks held: the P3s are the latest and the lowest
    core.add(areq("p1", prompt=160, prio=1, arrival=20.0))  # needs 10 blocks, 5 free
    core.step()
    # a decode's growth preempted the latest P3 (the core's rule); that step admits nobody
    assert "c3-2" in rids(core.waiting) and core.preemptions == 1 and pol.marked == []
    core.step()  # the claim marks the next
    assert rids(pol.marked) == ["c3-1"]


def test_the_waiting_line_orders_classes_then_the_inner_policys_order():
    line = PriorityKVPolicy(ScorpioPolicy(PROF)).new_waiting_line()
    seqs = [Seq(areq("p2", prio=2, arrival=0.0), 0), Seq(areq("p1-late", prio=1, arrival=5.0), 1),
            Seq(areq("p1-urgent", prio=1, arrival=6.0, deadline=6.1), 2), Seq(areq("p0", prio=0, arrival=9.0), 3)]
    for s in seqs:
        line.push(s)
    assert rids(line.ordered()) == ["p0", "p1-urgent", "p1-late", "p2"]


def test_heartbeat_fields_and_budget_come_from_the_inner_policy():
    pol = PriorityKVPolicy(ScorpioPolicy(PROF))
    core = SimEngineCore(PROF, 16, policy=pol)
    core.add(areq("a", 40.0))
    core.step()
    assert core.stats().min_tpot_slo_ms == 40.0
    assert PriorityKVPolicy().heartbeat_fields(core) == {}
    assert PriorityKVPolicy().token_budget(core) == PROF.max_num_batched_tokens


def test_engine_policies_by_name():
    import pytest
    from tokenyard.services.worker.sim.engine_policies import ENGINE_POLICIES, make_engine_policy
    from tokenyard.services.worker.sim.scheduler import VllmPolicy

    made = {n: make_engine_policy(n, PROF) for n in ENGINE_POLICIES}
    assert isinstance(made["vllm"], VllmPolicy) and isinstance(made["scorpio"], ScorpioPolicy)
    assert isinstance(made["scorpio+kv"].inner, ScorpioPolicy)
    with pytest.raises(ValueError, match="unknown engine policy"):
        make_engine_policy("sjf", PROF)
