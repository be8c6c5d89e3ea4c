"""`tokenyard router --nats URL [--policy multiplicative|multiplicative-exact|dynamo|llmd|sglang|…]
[--index-mode auto|precise|approximate] [--prefill-tokens-per-s R] [--bs-cap N]
[--no-migration] [--max-migrations N]`."""

from __future__ import annotations

from tokenyard.shared import config


def register(sub) -> None:
    from tokenyard.services.router.core import INDEX_MODES, POLICIES, RouterConfig

    p = sub.add_parser("router", help="pick the worker for each request")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    d = RouterConfig()
    p.add_argument("--policy", choices=list(POLICIES), default=d.policy, help="how a worker is picked")
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
    from tokenyard.services.router.migration import MigrationConfig

    m = MigrationConfig()
    p.add_argument("--no-migration", action="store_true",
                   help="end a dead worker's requests with an error instead of moving them")
    p.add_argument("--max-migrations", type=int, default=m.max_migrations,
                   help="how many times one request may move to another worker")
    p.set_defaults(func=main)


def main(args) -> int:
    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.migration import MigrationConfig
    from tokenyard.services.router.shell import RouterShell
    from tokenyard.shared.service import run

    cfg = RouterConfig(
        policy=args.policy,
        index_mode=args.index_mode,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        bs_cap=args.bs_cap,
    )
    migration = MigrationConfig(enabled=not args.no_migration, max_migrations=args.max_migrations)
    run(RouterShell(cfg, migration=migration), args.nats, args.metrics_port)
    return 0
