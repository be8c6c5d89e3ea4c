"""`tokenyard edge --nats URL [--host H] [--http-port P] [--model NAME ...] [--processes N]`: the
OpenAI-compatible HTTP edge (services/edge/shell.py), as N processes on one port (default: one
per CPU, config.edge_processes(); services/edge/supervisor.py starts and watches them)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from tokenyard.shared import config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "edge", help="OpenAI-compatible HTTP edge (/v1/completions, /v1/chat/completions)"
    )
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (0: any free one)")
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help=f"a served model name, repeatable (default: {config.DEFAULT_MODEL})",
    )
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds a request may take")
    p.add_argument("--max-in-flight", type=int, default=config.EDGE_MAX_IN_FLIGHT,
                   help="generation requests one edge process holds open at once; beyond: 503 with Retry-After")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="edge processes serving the HTTP port together (SO_REUSEPORT), each with its own NATS "
                        f"connection (default: one per CPU, at most {config.EDGE_MAX_PROCESSES}: "
                        f"{config.edge_processes()} here)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind the HTTP port with SO_REUSEPORT, to share it with other edge processes "
                        "(what --processes gives each of its processes)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int | None:
    processes = config.edge_processes() if args.processes is None else args.processes
    if processes < 1:
        print("tokenyard edge: error: --processes must be at least 1", file=sys.stderr)
        return 2
    if processes > 1:
        return _supervise(args, processes)
    # The edge holds ~30 KB per open request; under pymalloc an overload leaves ~40 % of
    # it behind in half-used arenas for good. On glibc's malloc the shell's idle trim
    # (malloc_trim) hands it back (measured: +38 MB vs +7 MB after 3,000 held requests).
    # The allocator is chosen at interpreter start, hence the re-exec.
    if "PYTHONMALLOC" not in os.environ:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, "PYTHONMALLOC": "malloc"})
    from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
    from tokenyard.shared import service

    cfg = EdgeConfig(
        host=args.host,
        http_port=args.http_port,
        models=args.models or [config.DEFAULT_MODEL],
        request_timeout_s=args.request_timeout,
        max_in_flight=args.max_in_flight,
        reuse_port=args.reuse_port,
    )
    service.run(EdgeShell(cfg), args.nats, args.metrics_port)
    return None


def child_command(nats: str, host: str, http_port: int, models: list[str], *extra: str) -> list[str]:
    """One of several edge processes on `http_port` (for the supervisor and `tokenyard up`)."""
    return [sys.executable, "-m", "tokenyard.cli", "edge", "--nats", nats, "--host", host,
            "--http-port", str(http_port), *(a for m in models for a in ("--model", m)),
            "--processes", "1", "--reuse-port", *extra]


def _supervise(args: argparse.Namespace, processes: int) -> int:
    from tokenyard.services.edge.supervisor import EdgeSupervisor
    from tokenyard.shared.natsutil import free_port, port_taken

    if args.http_port and port_taken(args.host, args.http_port):  # the children's binds would share it
        print(f"tokenyard edge: port {args.http_port} is in use", file=sys.stderr, flush=True)
        return 1
    port = args.http_port or free_port()  # one port for all: each child binding 0 would get its own
    cmd = child_command(args.nats, args.host, port, args.models or [config.DEFAULT_MODEL],
                        "--request-timeout", str(args.request_timeout), "--max-in-flight", str(args.max_in_flight))
    print(f"tokenyard edge: {processes} processes on http://{args.host}:{port}", file=sys.stderr, flush=True)
    return asyncio.run(EdgeSupervisor(cmd, processes, args.metrics_port).run())
