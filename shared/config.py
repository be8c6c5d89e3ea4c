"""Configuration shared by the services: defaults, and the environment overrides every
service reads (`TOKENYARD_*`). Service-specific options are CLI flags of that service."""

from __future__ import annotations

import os

DEFAULT_MODEL = os.environ.get("TOKENYARD_MODEL", "tokenyard-sim")
"""The model name a fleet serves when none is configured."""

BLOCK_SIZE = int(os.environ.get("TOKENYARD_BLOCK_SIZE", "16"))
"""Tokens per KV block, for the block-hash chain and the engines."""

MAX_MODEL_LEN = int(os.environ.get("TOKENYARD_MAX_MODEL_LEN", "32768"))
"""Prompt + max_tokens may not exceed this."""

DEFAULT_MAX_TOKENS = 16
"""OpenAI's completions default when a request names no max_tokens."""

DEFAULT_CHAT_MAX_TOKENS = int(os.environ.get("TOKENYARD_DEFAULT_CHAT_MAX_TOKENS", "256"))

HEARTBEAT_INTERVAL_S = float(os.environ.get("TOKENYARD_HEARTBEAT_S", "0.1"))
STALE_AFTER_S = 1.0
"""How old a queue replica's state may be before admission ignores it, and the Retry-After of
a refusal for want of workers. A worker's staleness: shared/staleness.py (derived from the
heartbeat interval it announces; `TOKENYARD_STALE_S` overrides that)."""


EDGE_MAX_IN_FLIGHT = 4096
"""Generation requests one edge holds open at once (beyond: 503 with Retry-After)."""


def nats_url_from_env(default: str = "nats://127.0.0.1:4222") -> str:
    return os.environ.get("TOKENYARD_NATS_URL", default)


def add_metrics_port_argument(parser) -> None:
    """`--metrics-port`: every service's Prometheus endpoint (shared/metrics.py), env
    TOKENYARD_METRICS_PORT; unset: none."""
    env = os.environ.get("TOKENYARD_METRICS_PORT")
    parser.add_argument("--metrics-port", type=int, default=int(env) if env else None,
                        help="serve Prometheus GET /metrics on this port (env TOKENYARD_METRICS_PORT; 0: any free port)")
