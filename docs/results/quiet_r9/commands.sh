#!/usr/bin/env bash
cd "$(git rev-parse --show-toplevel)" && source .venv/bin/activate
exec 9>"${LOCK:-/tmp/live.lock}"; flock 9
t() { echo "== $(date +%T) load $(cut -d' ' -f1 /proc/loadavg) $*"; }
t router1; tokenyard bench router --instances 256 --json > docs/results/quiet_r9/bench_router1.json 2>&1
t router2; tokenyard bench router --instances 256 --json > docs/results/quiet_r9/bench_router2.json 2>&1
t live_router; python -m bench.live_router --routers tokenyard,tokenyard-noflow,sglang --loads 1,3 --json docs/results/quiet_r9/live_router.json > docs/results/quiet_r9/live_router.txt 2>&1
t live_burst; python -m bench.live_burst --out docs/results/quiet_r9/live_burst.json > docs/results/quiet_r9/live_burst.txt 2>&1
t control_plane; python -m bench.control_plane --ttft-prompts 200 --warmup 20 --profile-requests 100 --json docs/results/quiet_r9/control_plane.json > docs/results/quiet_r9/control_plane.txt 2>&1
t sim_speed; python -m bench.sim_speed --full-only --instances 128 --json docs/results/quiet_r9/sim_speed_1.json > docs/results/quiet_r9/sim_speed_1.txt 2>&1
t router3; tokenyard bench router --instances 256 --json > docs/results/quiet_r9/bench_router3.json 2>&1
t done
