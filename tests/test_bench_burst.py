"""bench.live_burst's tenant and per-class report, and bench.sim_burst's class mix: the burst
carries the design's P0 share (DESIGN §3.2) only if its tenant may ask for P0, and each class's
first refusal and refusals are counted apart."""

from __future__ import annotations

import tomllib

import pytest
from tokenyard.loadgen.records import RequestRecord
from tokenyard.services.admission.tenants import load_tenants
from tokenyard.shared.schemas import PriorityClass

from bench import live_burst, sim_burst


def test_the_bursts_tenant_may_ask_for_p0_and_a_plain_one_may_not():
    table = load_tenants(tomllib.loads(live_burst.TENANTS))
    assert table.policy(table.tenant_of(None, live_burst.TENANT)).ceiling == PriorityClass.P0
    assert table.policy(table.tenant_of(None, "someone")).ceiling == PriorityClass.P1


def record(index: int, priority: int, send: float, *, first_token: float | None = None,
           refused_at: float | None = None, code: str = "status_503") -> RequestRecord:
    r = RequestRecord(index=index, priority=priority, prompt_len=2000, scheduled_s=send, send_s=send)
    if first_token is not None:
        r.chunk_s = [first_token, first_token + 0.05]
        r.close(first_token + 0.05)
    else:
        r.fail(code, "refused")
        r.close(refused_at)
    return r


def test_the_report_gives_each_class_its_first_refusal_refusals_and_p99_over_target():
    records = [
        record(0, 0, 10.0, first_token=10.3),                  # P0 served in 0.3 s: 0.6 × 0.5 s
        record(1, 1, 10.1, first_token=14.1),                  # P1 served in 4.0 s
        record(2, 1, 10.5, refused_at=10.9),                   # P1 refused 0.9 s after the first send
        record(3, 1, 10.6, refused_at=11.2),
        record(4, 2, 10.7, refused_at=11.5, code="status_429"),  # P2 expired in the queue
        record(5, 2, 10.8, first_token=22.8),                  # P2 served in 12 s: 0.2 × 60 s
    ]
    out = live_burst.report(records)
    assert abs(out["first_refusal_after_s"] - 0.9) < 1e-9
    assert out["refused"] == {"status_429": 1, "status_503": 2}
    p0, p1, p2 = (out["by_class"][k] for k in ("P0", "P1", "P2"))
    assert "P3" not in out["by_class"]
    assert (p0["sent"], p0["served"], p0["refused"], p0["first_refusal_after_s"]) == (1, 1, {}, None)
    assert abs(p0["p99_over_target"] - 0.6) < 1e-9
    assert (p1["sent"], p1["served"], p1["refused"]) == (3, 1, {"status_503": 2})
    assert abs(p1["first_refusal_after_s"] - 0.9) < 1e-9 and abs(p1["p99_ttft_s"] - 4.0) < 1e-9
    assert (p2["sent"], p2["served"], p2["refused"]) == (2, 1, {"status_429": 1})
    assert abs(p2["first_refusal_after_s"] - 1.5) < 1e-9 and abs(p2["p99_over_target"] - 0.2) < 1e-9


def test_a_class_with_nothing_served_still_reports_its_refusals():
    out = live_burst.report([record(0, 1, 0.0, refused_at=0.4), record(1, 2, 0.1, first_token=1.1)])
    assert out["by_class"]["P1"] == {"sent": 1, "served": 0, "refused": {"status_503": 1},
                                     "first_refusal_after_s": 0.4}


def test_the_simulated_burst_takes_the_design_mix_by_default(capsys):
    sim_burst.main(["--rate", "100", "--seconds", "1", "--input-len", "512", "--output-len", "16"])
    lines = capsys.readouterr().out.splitlines()
    classes = [line.split()[0] for line in lines if line.startswith("P")]
    assert classes == ["P0", "P1", "P2", "P3"]  # 100 arrivals at 5/60/30/5: every class is drawn
    sent = sum(int(line.split()[2]) for line in lines if line.startswith("P"))
    assert sent == 100


def sim_state(arrival: float, priority: int = 1, *, first_token: float | None = None, budget: float = 5.0,
              expired: bool = False, refused: bool = False):
    from tokenyard.loadgen.workloads.blocks import TraceRequest
    from tokenyard.simulator.requests import ReqState

    st = ReqState(TraceRequest(0, arrival, 2000, 100, priority, ()), ttft_budget_s=budget)
    if first_token is not None:
        st.tokens.append(first_token)
        st.finished = True
    st.expired = expired
    if expired or refused:
        st.error = "status_429" if expired else "status_503"
    return st


def test_the_first_admitted_request_that_failed_its_deadline_is_where_a_forecast_should_have_refused():
    states = [sim_state(10.0, first_token=14.9),                # on time (4.9 s of its 5 s)
              sim_state(10.3, refused=True),                    # refused: not admitted
              sim_state(10.5, first_token=15.6),                # late: 5.1 s
              sim_state(10.2, expired=True),                    # expired in the queue
              sim_state(10.1, priority=3, first_token=40.0, budget=0.0),  # P3: no deadline
              sim_state(10.4, first_token=15.3, budget=5.2)]    # its deadline has its own prefill
    failed, first = sim_burst.admitted_but_failed(states, t0=10.0)
    assert failed == 2 and first == pytest.approx(0.2)  # the expired one, before the late one
    assert sim_burst.admitted_but_failed(states[:2], t0=10.0) == (0, None)


def test_the_forecast_comparison_sets_each_forecast_on_the_simulators_admission(capsys):
    import math

    from bench import burst_forecast

    args = sim_burst.parser().parse_args(["--rate", "100", "--seconds", "1", "--input-len", "512", "--output-len", "16"])

    from types import SimpleNamespace

    from tokenyard.services.admission.feasibility import ARRIVAL_WINDOW_S, FleetView

    for name, counted, rate in [("measured", ARRIVAL_WINDOW_S, None), ("whole-wait", math.inf, None),
                                ("true-rate", ARRIVAL_WINDOW_S, 100 * 528 * 0.05)]:
        sim = SimpleNamespace(admission=SimpleNamespace(fleet=FleetView()))
        burst_forecast.forecast(name, args)(sim)
        assert sim.admission.fleet.overtaking_counted_s == counted
        if rate is not None:  # P0's share of the design mix 5/60/30/5, at (512 + 16) work a request
            assert sim.admission.fleet.arrival_rate(range(1), 0.0) == pytest.approx(rate)
    with pytest.raises(ValueError, match="unknown forecast"):
        burst_forecast.forecast("psychic", args)(sim)
    # the measured row is the plain burst's: the same first refusal and counts
    items, states = sim_burst.burst(args)
    row = burst_forecast.row(items, states)
    assert row["first_refusal_s"] == sim_burst.first_refusal(items, states)
    assert sum(row[f"P{c}"]["sent"] for c in range(4)) == 100
    assert all(row[f"P{c}"]["met"] == row[f"P{c}"]["served"] - row[f"P{c}"]["late"] for c in range(4))
    assert burst_forecast.main(["--seeds", "0", "--forecasts", "measured", "--rate", "100", "--seconds", "1",
                                "--input-len", "512", "--output-len", "16"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[2].startswith("| 0 | measured |")
