"""`tokenyard macro --nats URL [--macro-size K] [--mode nodg]`."""

from __future__ import annotations

from shared import config


def register(sub) -> None:
    from services.macro_instance.core import MODES

    p = sub.add_parser("macro", help="group workers into macro-instances and set their phases")
    p.add_argument("--nats", default=config.nats_url_from_env())
    p.add_argument("--macro-size", type=int, default=4)
    p.add_argument("--mode", choices=MODES, default="nodg")
    p.set_defaults(func=main)


def main(args) -> int:
    from services.macro_instance.core import MacroConfig
    from services.macro_instance.shell import MacroShell
    from shared.service import run

    run(MacroShell(MacroConfig(size=args.macro_size, mode=args.mode)), args.nats)
    return 0
