#!/usr/bin/env bash
# Regenerates every number in docs/RESULTS.md: the policy × workload × load sweep
# (bench/run_results.py → docs/results/*.json, plots), the simulator's speed and memory
# (bench/sim_speed.py → docs/results/sim_speed.json), then the document's tables
# (bench/results_doc.py). About 45–60 min on 2 cores; JOBS=N runs N sweep points at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m bench.run_results --jobs "${JOBS:-2}"
"$PY" -m bench.run_results --jobs "${JOBS:-2}" --only mooncake-full --loads 1,2
"$PY" -m bench.sim_speed --json docs/results/sim_speed.json || echo "sim_speed: the 100x target at 128 instances was missed (see the JSON)"
"$PY" -m bench.results_doc
