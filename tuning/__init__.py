"""`tokenyard tune`: Bayesian optimisation (optuna's TPE) of the queue's knobs — bubble width
and aging thresholds — over the cluster simulator, for one workload of the registry (loadgen.workloads; the
heavy-tailed length mix is `heavy-tail`).

    objective.py   the score of one run: α·throughput + β·long-request completion − γ·short latency
    evaluate.py    one simulator run with given knobs → the measures the objective reads
    search.py      the optuna study: defaults first, then `trials` proposals; best vs defaults
    cli.py         the subcommand
"""
