#!/bin/bash
# README's closed loop of 32 aimed at nats://127.0.0.1:PORT while a 10x burst runs on the fleet
# that holds PORT (the creds `up` leaves there are found with no flag, as README's line does).
cd "$(git rev-parse --show-toplevel)"
D=docs/results/burst7; L=/tmp/burst7-port; rm -rf $L; mkdir -p $L
echo "port start $(date +%T) $(uptime)" >> $D/live-load.txt
ls ~/.cache/tokenyard/ > $L/before.txt 2>/dev/null
.venv/bin/python -m bench.live_burst --seconds 8 --out $D/port-burst.json > $L/burst.out 2>&1 &
B=$!
for i in $(seq 200); do
  NEW=$(ls ~/.cache/tokenyard/ 2>/dev/null | grep -vxFf $L/before.txt | head -1)
  [ -n "$NEW" ] && [ -e ~/.cache/tokenyard/$NEW/client.creds ] && break
  sleep 0.2
done
PORT=${NEW#nats-}
echo "burst fleet on $PORT after $i polls" >> $L/notes.txt
env -u TOKENYARD_NATS_CREDS .venv/bin/tokenyard bench serve --target nats://127.0.0.1:$PORT --concurrency 32 --num-prompts 200 --request-timeout 20 --no-progress --result-json $D/readme-c32-on-burst-fleet.json > $L/bench.out 2>&1
wait $B
echo "port end $(date +%T) $(uptime)" >> $D/live-load.txt
