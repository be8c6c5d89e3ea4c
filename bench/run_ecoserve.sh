#!/usr/bin/env bash
# Every figure of docs/results-ecoserve.md, in order (issue 13). Usage:
#     [FROM=N] [TO=N] [NUM=600] bench/run_ecoserve.sh [OUT_DIR]
# The Azure traces are the repo's own (workloads azure-code, azure-conv); OUT_DIR defaults to
# docs/results/ecoserve. FROM=N starts at the Nth run, TO=N stops after it (the JSON of the
# others is kept). NUM: requests per point (the document's runs: 600, on a shared 2-core machine).
# Each run prints its table; bench/ecoserve_doc.py then refills the document's tables.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "run_ecoserve.sh: unknown option $1 (OUT_DIR is the only argument; --help)" >&2; exit 2 ;;
esac
out=${1:-docs/results/ecoserve}
from=${FROM:-1}
to=${TO:-99}
num=${NUM:-600}
mkdir -p "$out"
n=0
run() {
  n=$((n + 1))
  if [ "$n" -ge "$from" ] && [ "$n" -le "$to" ]; then "$@"; fi
}
bench="nice -n 19 .venv/bin/python bench/ecoserve_goodput.py --num-requests $num"
# 1-3: the seed's regime, CodeLlama-34B at TP 4 on PCIe L20s, 100 Gbps between instances.
run $bench --workload coder --rates 0.1,0.2,0.3,0.4 --json "$out/tp4_coder.json"
run $bench --workload azure-conv --rates 1,2,4,8 --json "$out/tp4_conv.json" \
  --systems vllm,sarathi,distserve,distserve-search,ecoserve,ecoserve-pure
run $bench --workload azure-code --rates 0.5,1,2 --json "$out/tp4_code.json"
# 4-5: the 8B / A100 table (issue 8's regime), now with the fixes and the baselines.
run $bench --workload azure-code --profile a100-llama3-8b --max-model-len 131072 \
  --rates 1,2,4 --ttft-ms 2000 --tpot-ms 100 --json "$out/a100_code.json"
run $bench --workload azure-conv --profile a100-llama3-8b --max-model-len 131072 \
  --rates 8,16,24 --ttft-ms 2000 --tpot-ms 50 --json "$out/a100_conv.json"
# 6-7: the command, x1 and x2 (600 requests: both loads overrun the fleet).
for x in 1 2; do
  run nice -n 19 .venv/bin/tokenyard sim --workload coder --num-requests 600 --rate-scale "$x" --instances 16 \
    --macro-size 4 --profile l20-codellama34b-tp4 --max-model-len 16384 --goodput ttft:3000 tpot:150 \
    --mode ecoserve,nodg,pd --json "$out/issue_coder_x$x.json" --quiet
done
# 8: mitosis acted on, a load that rises and falls, the seed's windows (5 min grow, 10 min shrink).
run nice -n 19 .venv/bin/python bench/ecoserve_mitosis.py --workload azure-conv --profile l20-codellama34b-tp4 \
  --phases 0.5:5,4:35,0.3:50 --ttft-ms 3000 --tpot-ms 150 --json "$out/mitosis.json" --plot "$out/mitosis.png"
