#!/bin/bash
# README's closed loop of 32 against up's default fleet, on a machine loaded by two nice'd sims.
cd "$(git rev-parse --show-toplevel)"
D=docs/results/burst7; L=${1:-/tmp/burst7-readme}; TAG=${2:-before}
rm -rf $L; mkdir -p $L
echo "readme $TAG start $(date +%T) $(uptime)" >> $D/live-load.txt
loaders=()
touch $L/load.on
for k in 1 2; do
  ( while [ -e $L/load.on ]; do nice -n 19 .venv/bin/python -m bench.sim_burst --seconds 20 --seed $k > /dev/null 2>&1; done ) &
  loaders+=($!)
done
.venv/bin/tokenyard up --nats-creds-dir $L/creds --log-dir $L/logs > $L/up.out 2>&1 &
UP=$!
for i in $(seq 120); do grep -q "Ctrl-C" $L/up.out && break; sleep 1; done
URL=$(grep -o 'nats://[^ ]*' $L/up.out | head -1)
echo "url $URL after ${i}s; load $(uptime)" >> $L/notes.txt
TOKENYARD_NATS_CREDS=$L/creds/client.creds .venv/bin/tokenyard bench serve --target $URL --concurrency 32 --num-prompts 500 --no-progress --result-json $D/readme-c32-$TAG.json > $L/bench.out 2>&1
echo "readme $TAG end $(date +%T) $(uptime)" >> $D/live-load.txt
kill -INT $UP; wait $UP
rm -f $L/load.on
for p in "${loaders[@]}"; do pkill -P $p; done
wait
for i in 4 5; do
  echo "run $i start $(date +%T) $(uptime)" >> $D/live-load.txt
  .venv/bin/python -m bench.live_burst --out $D/live-burst-5-60-30-5-run$i.json --log-dir /tmp/burst7-logs-$i > /tmp/burst7-live-$i.out 2>&1
  echo "run $i end $(date +%T) $(uptime)" >> $D/live-load.txt
done
