#!/usr/bin/env bash
# Every figure of docs/results-ecoserve.md, in order (issue 13). Usage:
#     bench/run_ecoserve.sh TRACE_DIR [OUT_DIR]
# TRACE_DIR holds azure2023_code.csv and azure2023_conv.csv; OUT_DIR defaults to
# docs/results/ecoserve. Each run prints its table; the JSON files are what the document cites.
set -euo pipefail
traces=${1:?usage: bench/run_ecoserve.sh TRACE_DIR [OUT_DIR]}
out=${2:-docs/results/ecoserve}
mkdir -p "$out"
py=".venv/bin/python"
b="nice -n 5 $py bench/ecoserve_goodput.py --num-requests 1200"
# The seed's regime: CodeLlama-34B, TP 4, PCIe L20s, 100 Gbps between instances.
$b --workload coder --rates 0.1,0.2,0.3,0.4 --json "$out/tp4_coder.json"
$b --workload "trace:$traces/azure2023_conv.csv" --rates 1,2,4,8 --json "$out/tp4_conv.json"
$b --workload "trace:$traces/azure2023_code.csv" --rates 1,2,4,8 --json "$out/tp4_code.json"
# The 8B / A100 table (issue 8's regime), now with the fixes and the baselines.
$b --workload "trace:$traces/azure2023_code.csv" --profile a100-llama3-8b --max-model-len 131072 \
   --rates 1,2,4,8 --ttft-ms 2000 --tpot-ms 100 --json "$out/a100_code.json"
$b --workload "trace:$traces/azure2023_conv.csv" --profile a100-llama3-8b --max-model-len 131072 \
   --rates 8,16,24,32 --ttft-ms 2000 --tpot-ms 50 --json "$out/a100_conv.json"
# The command, x1 and x2.
for x in 1 2; do
  nice -n 5 .venv/bin/tokenyard sim --workload coder --num-requests 1200 --rate-scale $x --instances 16 \
    --macro-size 4 --profile l20-codellama34b-tp4 --max-model-len 16384 --goodput ttft:3000 tpot:150 \
    --mode ecoserve,nodg,pd --json "$out/issue_coder_x$x.json" --quiet
done
