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
"""Generation requests one edge process holds open at once (beyond: 503 with Retry-After)."""

EDGE_MAX_PROCESSES = 8
"""The most edge processes `edge_processes()` picks on its own (a bigger host is better
served by more edge replicas behind a balancer than by one port's accept queue)."""


def edge_processes(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """How many processes serve the edge's HTTP port by default: one per CPU this process
    may run on (its affinity, and its cgroup's CPU quota where one is set, as in a
    container with a CPU limit), at most EDGE_MAX_PROCESSES. One Python process streams on
    one core; on a busy host several also get a bigger share of the CPUs (as a threaded
    router's do)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = open(cgroup_cpu_max).read().split()[:2]  # noqa: SIM115
        if quota != "max":
            cpus = min(cpus, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota to honour
    return max(1, min(cpus, EDGE_MAX_PROCESSES))


def nats_url_from_env(default: str = "nats://127.0.0.1:4222") -> str:
    return os.environ.get("TOKENYARD_NATS_URL", default)


METRICS_PORT_ENV = "TOKENYARD_METRICS_PORT"


def add_metrics_port_argument(parser) -> None:
    """`--metrics-port`: every service's Prometheus endpoint (shared/metrics.py), env
    TOKENYARD_METRICS_PORT; unset: none."""
    env = os.environ.get(METRICS_PORT_ENV)
    parser.add_argument("--metrics-port", type=int, default=int(env) if env else None,
                        help="serve Prometheus GET /metrics on this port (env TOKENYARD_METRICS_PORT; 0: any free port)")
