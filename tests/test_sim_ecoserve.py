"""EcoServe in the cluster simulator (issue 13): the fleet runs to the SLOs it is scored
against — the engines' saved-slack clocks (fix 1) and the macro-instance controller, hence the
router's constraint check (fix 2) — and the filter's fallbacks are counted."""

from __future__ import annotations

from tokenyard.loadgen.workloads import PrefixIds, TraceRequest
from tokenyard.simulator.cluster import ClusterSim, SimConfig, with_slos
from tokenyard.simulator.run import simulate

GOODPUT = {"ttft": 3000.0, "tpot": 50.0}


class Fixed:
    name = "fixed"
    block_tokens = 16

    def __init__(self, items: list[TraceRequest]):
        self._items = items

    def items(self) -> list[TraceRequest]:
        return self._items


def workload(n: int = 24, gap_s: float = 0.05) -> Fixed:
    ids = PrefixIds(16)
    return Fixed([TraceRequest(i, i * gap_s, 600, 40, 1, ids.ids([(("q", i), 600)])) for i in range(n)])


def test_goodput_slos_reach_every_engine_and_the_macro_controller():
    sim = ClusterSim(with_slos(SimConfig(instances=4, macro_size=4, mode="ecoserve"), GOODPUT), 16)
    assert {inst.engine.slack.default_tpot_slo_ms for inst in sim.instances} == {50.0}
    eco = sim.macro.cfg.rolling.eco
    assert (eco.ttft_slo_ms, eco.tpot_slo_ms) == (3000.0, 50.0)
    sim.run(workload().items())
    rows = [sim.router.view.slot[inst.id] for inst in sim.instances]
    assert set(sim.router.view.eco_ttft_ms[rows].tolist()) == {3000.0}  # the MacroStates carried them


def test_explicit_slos_win_over_the_goodput_and_defaults_fill_the_rest():
    cfg = with_slos(SimConfig(tpot_slo_ms=80.0), {"ttft": 500.0, "tpot": 50.0})
    assert cfg.slos() == (500.0, 80.0)
    assert SimConfig().slos() == (2000.0, 100.0)
    assert with_slos(SimConfig(), None).slos() == (2000.0, 100.0)


def test_a_run_reports_the_slos_it_ran_to_and_the_filter_fallbacks():
    res = simulate(workload(), SimConfig(instances=4, macro_size=4, mode="ecoserve"), GOODPUT)
    assert res["fleet_slo_ms"] == GOODPUT
    f = res["ecoserve_filter"]
    assert f["decisions"] >= 24  # every placement saw EcoServe rows
    assert 0 <= f["fallbacks"] <= f["decisions"]
    assert res["completed"] == 24
    nodg = simulate(workload(), SimConfig(instances=4, macro_size=4, mode="nodg"), GOODPUT)
    assert nodg["ecoserve_filter"] == {"decisions": 0, "fallbacks": 0, "refused": {}}
