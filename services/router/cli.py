"""`tokenyard router --nats URL [--policy least-loaded|round-robin]`."""

from __future__ import annotations

from shared import config


def register(sub) -> None:
    from services.router.core import POLICIES

    p = sub.add_parser("router", help="pick the worker for each request")
    p.add_argument("--nats", default=config.nats_url_from_env())
    p.add_argument("--policy", choices=sorted(POLICIES), default="least-loaded")
    p.set_defaults(func=main)


def main(args) -> int:
    from services.router.core import RouterConfig
    from services.router.shell import RouterShell
    from shared.service import run

    run(RouterShell(RouterConfig(policy=args.policy)), args.nats)
    return 0
