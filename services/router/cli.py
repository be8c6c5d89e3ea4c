"""`tokenyard router --nats URL [--policy marginal-latency|multiplicative|multiplicative-exact|dynamo|llmd|…]
[--index-mode auto|precise|approximate] [--prefill-tokens-per-s R] [--bs-cap N]
[--no-migration] [--max-migrations N]`.

The same options (the policy as `--router-policy`) serve `tokenyard queue --with-router`, a
router in the queue's process (`add_router_arguments`, `router_shell`)."""

from __future__ import annotations

import argparse

from tokenyard.shared import config


def register(sub) -> None:
    p = sub.add_parser("router", help="pick the worker for each request")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    add_router_arguments(p)
    p.set_defaults(func=main)


def add_router_arguments(p, policy_flag: str = "--policy") -> None:
    """The router's own options; `policy_flag`: the policy's flag (`--router-policy` where
    `--policy` is another service's)."""
    from tokenyard.services.router.core import INDEX_MODES, POLICIES, RouterConfig
    from tokenyard.services.router.migration import MigrationConfig

    d = RouterConfig()
    p.add_argument(policy_flag, dest="router_policy", choices=list(POLICIES), default=d.policy,
                   help=f"how a worker is picked (default {d.policy})")
    p.add_argument(
        "--index-mode",
        choices=INDEX_MODES,
        default=d.index_mode,
        help="precise: workers' KV events; approximate: predicted from routing, with a TTL",
    )
    p.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=d.prefill_tokens_per_s,
        help="one instance's prefill rate, for the TTFT guard",
    )
    p.add_argument("--bs-cap", type=int, default=None, help="batch-size cap of the multiplicative policies")
    m = MigrationConfig()
    p.add_argument("--no-migration", action="store_true",
                   help="end a dead worker's requests with an error instead of moving them")
    p.add_argument("--max-migrations", type=int, default=m.max_migrations,
                   help="how many times one request may move to another worker")


def router_shell(args: argparse.Namespace, feeds=None):
    """The RouterShell the options parsed by `add_router_arguments` ask for; `feeds`: the
    fan-out subscriptions it shares with the services in its process (shared/feed.py)."""
    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.migration import MigrationConfig
    from tokenyard.services.router.shell import RouterShell

    cfg = RouterConfig(
        policy=args.router_policy,
        index_mode=args.index_mode,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        bs_cap=args.bs_cap,
    )
    migration = MigrationConfig(enabled=not args.no_migration, max_migrations=args.max_migrations)
    return RouterShell(cfg, migration=migration, feeds=feeds)


def main(args) -> int:
    from tokenyard.shared.service import run

    run(router_shell(args), args.nats, args.metrics_port)
    return 0
