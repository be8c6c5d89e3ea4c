"""Where admission's forecast of a burst errs: bench.sim_burst's burst (same seeds, the same
cores on a virtual clock) with admission's overtaking term three ways, side by side.

    python -m bench.burst_forecast [--seeds 0,1,2,3,4] [bench.sim_burst's options]

A class-c request's predicted wait counts the work of higher classes that will arrive and pass
it, at the rate λ admission measured over the last T = 2 s, for at most T of the wait
(services/admission/feasibility.py):
  measured    as shipped
  true-rate   λ the burst's true rate of that work (rate × the classes' share of the mix ×
              (input + output) tokens): an oracle, what an estimate free of the draw's noise gives
  whole-wait  λ as measured, counted over the whole wait (ahead / (D − λ), the textbook form)
Per seed and forecast: the first refusal, the admitted requests that then went late or expired
(and when the first of them arrived: where a forecast that knew the burst's future would have
refused first), per class the served, late and refused counts, and P1 met (served on time).
"""

from __future__ import annotations

import math
import sys

from bench import sim_burst

FORECASTS = ("measured", "true-rate", "whole-wait")


def forecast(name: str, args):
    """The `prepare(sim)` that sets admission's forecast `name` on the simulator's admission."""
    from tokenyard.loadgen.config import parse_priority_mix

    mix = parse_priority_mix(args.mix)
    work = args.input_len + args.output_len

    def prepare(sim) -> None:
        fleet = sim.admission.fleet
        if name == "true-rate":
            fleet.arrival_rate = lambda classes, now: args.rate * work * sum(mix[k] for k in classes) / sum(mix)
        elif name == "whole-wait":
            fleet.overtaking_counted_s = math.inf
        elif name != "measured":
            raise ValueError(f"unknown forecast {name!r}; choose from {', '.join(FORECASTS)}")
    return prepare


def row(items: list, states: list) -> dict:
    t0 = items[0].arrival_s
    failed, first_failed = sim_burst.admitted_but_failed(states, t0)
    out: dict = {"first_refusal_s": sim_burst.first_refusal(items, states),
                 "admitted_then_failed": failed, "first_failed_arrival_s": first_failed}
    for c in range(4):
        mine = [st for st in states if st.item.priority == c]
        served = sum(1 for st in mine if st.finished and len(st.tokens))
        late = sum(map(sim_burst.late, mine))
        out[f"P{c}"] = {"sent": len(mine), "served": served, "late": late, "met": served - late,
                        "refused": sum(1 for st in mine if st.error and not st.expired),
                        "expired": sum(1 for st in mine if st.expired)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = sim_burst.parser()
    p.prog, p.description = "python -m bench.burst_forecast", __doc__
    p.add_argument("--seeds", default="0,1,2,3,4", help="workload seeds, comma list, one burst each (default: %(default)s)")
    p.add_argument("--forecasts", default=",".join(FORECASTS),
                   help=f"admission's forecasts to compare, comma list of {', '.join(FORECASTS)} (default: %(default)s)")
    args = p.parse_args(argv)
    fmt = lambda x: "never" if x is None else f"{x:.3f} s"  # noqa: E731
    print("| seed | forecast | first refusal | admitted, then late or expired (first arrived) | P1 served / late / **met** | P1 refused / expired | P2 refused |")
    print("|---|---|---|---|---|---|---|")
    for seed in (int(s) for s in args.seeds.split(",")):
        args.seed = seed
        for name in args.forecasts.split(","):
            r = row(*sim_burst.burst(args, forecast(name, args)))
            p1, p2 = r["P1"], r["P2"]
            print(f"| {seed} | {name} | {fmt(r['first_refusal_s'])} | {r['admitted_then_failed']} "
                  f"({fmt(r['first_failed_arrival_s'])}) | {p1['served']} / {p1['late']} / **{p1['met']}** | "
                  f"{p1['refused']} / {p1['expired']} | {p2['refused']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
