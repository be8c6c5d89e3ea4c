"""The search: optuna's TPE sampler (a Bayesian optimiser: Parzen-tree models of good and bad
trials, next proposal where their ratio is highest) over the knobs' ranges, log-scaled:

    bubble_width  [64, 8192] tokens     aging_p1_s [10, 120]   aging_p2_s [3, 60]   aging_p3_s [1, 30]

The default knobs are evaluated first and told to the study as trial 0 (the baseline every
score is normalised by, objective.py), then `trials` proposals are evaluated. `evaluate` is
any function knobs → Measures: the simulator (evaluate.py) or, in tests, a formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenyard.tuning.evaluate import KNOB_DEFAULTS
from tokenyard.tuning.objective import Measures, Weights, score

SPACE: dict[str, tuple[float, float]] = {
    "bubble_width": (64.0, 8192.0),
    "aging_p1_s": (10.0, 120.0),
    "aging_p2_s": (3.0, 60.0),
    "aging_p3_s": (1.0, 30.0),
}


@dataclass
class TuneResult:
    best_params: dict[str, float]
    best_score: float
    default_score: float
    default: Measures
    best: Measures
    trials: list[tuple[dict[str, float], float]] = field(default_factory=list)

    @property
    def gain(self) -> float:
        return self.best_score - self.default_score


DEFAULT_WEIGHTS = Weights()


def tune(evaluate: Callable[[dict[str, float]], Measures], trials: int, weights: Weights = DEFAULT_WEIGHTS,
         seed: int = 0, space: dict[str, tuple[float, float]] = SPACE) -> TuneResult:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    defaults = {k: KNOB_DEFAULTS[k] for k in space}
    base = evaluate(defaults)
    base_score = score(base, base, weights)
    dists = {k: optuna.distributions.FloatDistribution(lo, hi, log=True) for k, (lo, hi) in space.items()}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.add_trial(optuna.trial.create_trial(params=defaults, distributions=dists, value=base_score,
                                              user_attrs={"measures": base}))
    measured: dict[int, Measures] = {0: base}

    def objective(trial: optuna.Trial) -> float:
        params = {k: trial.suggest_float(k, lo, hi, log=True) for k, (lo, hi) in space.items()}
        m = evaluate(params)
        measured[trial.number] = m
        return score(m, base, weights)

    study.optimize(objective, n_trials=trials)
    best = study.best_trial
    return TuneResult(
        best_params=dict(best.params), best_score=float(best.value), default_score=base_score, default=base,
        best=measured[best.number], trials=[(dict(t.params), float(t.value)) for t in study.trials],
    )
