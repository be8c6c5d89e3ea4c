"""Mitosis scaling acted on inside the simulator (issue 13): the controller's ProvisionOps
start workers (after the start-up delay) that join the group that asked, drained workers stop
once their last request is done, groups split past N_upper and merge back — and every request
still completes. Windows are shortened here so a test runs in seconds; the seed's are the
default (`mitosis_config`)."""

from __future__ import annotations

from tokenyard.loadgen.workloads import PrefixIds, TraceRequest
from tokenyard.services.macro_instance.mitosis import MitosisConfig, mitosis_config
from tokenyard.simulator.cluster import ClusterSim, SimConfig
from tokenyard.simulator.run import simulate


def rising_and_falling() -> list[TraceRequest]:
    """20 s at 1 req/s, 40 s at 40 req/s, 140 s at 0.5 req/s: 2,048-token prompts."""
    ids, out, t, i = PrefixIds(16), [], 0.0, 0
    for until, gap in ((20.0, 1.0), (60.0, 0.025), (200.0, 2.0)):
        while t < until:
            out.append(TraceRequest(i, t, 2048, 64, 1, ids.ids([(("q", i), 2048)])))
            t += gap
            i += 1
    return out


def served_in_burst(sim: ClusterSim) -> int:
    return sum(st.finished for st in sim.reqs.values() if 20.0 <= st.item.arrival_s < 60.0)


def short(cfg: SimConfig) -> SimConfig:
    scaling = MitosisConfig(n_lower=2, n_upper=4, grow_window_s=5.0, shrink_window_s=10.0, max_workers=8)
    cfg.macro_options = {"scaling": scaling}
    return cfg


def test_the_seed_s_mitosis_is_sized_by_the_macro_instance():
    c = mitosis_config(4)
    assert (c.n_lower, c.n_upper, c.grow_window_s, c.shrink_window_s) == (2, 4, 300.0, 600.0)


def test_workers_are_started_and_stopped_as_the_controller_says():
    # Flow control on, as the product runs: the queue holds the burst's backlog and the
    # controller sees it there (the workers alone look busy but within their SLOs).
    cfg = short(SimConfig(instances=4, macro_size=4, mode="ecoserve", provision_delay_s=3.0, mitosis=True))
    sim = ClusterSim(cfg, 16)
    items = rising_and_falling()
    sim.run(items)
    kinds = [e[1] for e in sim.scaling_log]
    assert kinds.count("add") == kinds.count("started") >= 1  # load rose: workers were added …
    assert kinds.count("remove") == kinds.count("stopped") >= 1  # … and fell: some were removed
    first_add = next(e for e in sim.scaling_log if e[1] == "add")
    first_start = next(e for e in sim.scaling_log if e[1] == "started")
    assert first_start[0] == first_add[0] + 3.0  # the start-up delay
    sizes = [s[1] for s in sim.fleet_samples]
    assert 4 < max(sizes) <= 8 and sizes[-1] < max(sizes)  # max_workers counts those starting
    assert max(s[2] for s in sim.fleet_samples) >= 2  # a split happened past N_upper = 4
    assert kinds.count("grow") == kinds.count("add") and kinds.count("shrink") == kinds.count("remove")
    assert kinds.count("split") >= 1 and kinds.count("merge") >= 1 and sim.fleet_samples[-1][2] == 1
    burst = [s[3] for s in sim.fleet_samples if 20.0 <= s[0] <= 60.0]
    assert max(burst) > 0.05  # what it grew on: the queue's late backlog …
    assert all(s[3] == 0.0 for s in sim.fleet_samples if s[0] > 120.0)  # … gone once the load fell
    for st in sim.reqs.values():  # each request done in full, or refused by admission in the burst
        assert (st.finished and len(st.tokens) == 64) or (st.error or "").startswith("status_")
    # every request outside the burst is served; in it, the grown fleet serves more than the
    # four workers it started with would have alone (they finish 403 of its 1,601; 736 here)
    assert all(st.finished for st in sim.reqs.values() if not 20.0 <= st.item.arrival_s < 60.0)
    fixed = ClusterSim(SimConfig(instances=4, macro_size=4, mode="ecoserve"), 16)
    fixed.run(items)
    assert served_in_burst(sim) > 1.5 * served_in_burst(fixed)
    for wid in sim.stopped:  # a stopped worker left nothing behind
        assert not sim.by_id[wid].engine.has_work()


def test_a_run_reports_its_scaling():
    cfg = short(SimConfig(instances=4, macro_size=4, mode="nodg", provision_delay_s=3.0, mitosis=True))
    res = simulate(_Fixed(rising_and_falling()), cfg)
    s = res["scaling"]
    assert s["add"] == s["started"] and s["workers_max"] > 4 and s["workers_min"] <= 4


class _Fixed:
    name = "fixed"
    block_tokens = 16

    def __init__(self, items):
        self._items = items

    def items(self):
        return self._items
