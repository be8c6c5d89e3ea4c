"""The cluster simulator (`tokenyard sim`): workloads replayed through the live services'
cores — admission, priority queue, router, macro-instance controller, worker and simulated
engine — on a virtual clock, in one process (cluster.py). `simulator.run.simulate` runs one
policy, `simulator.run.compare` several on the same workload and fleet; cli.py is
`tokenyard sim`, report.py its table, JSON and plots, metrics.py its result keys."""
