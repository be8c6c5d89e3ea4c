"""`tokenyard` — one console script, subcommands in the manner of `vllm serve` /
`vllm bench serve` (docs/ARCHITECTURE.md §10). Each component registers its own subcommand; this module
only assembles them."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence


class HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless it names one itself, has none, or is a switch
    (a flag that takes no value: its help says what giving it does)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (action.option_strings and action.nargs != 0 and "default" not in text and default is not None
                and default is not False
                and default != argparse.SUPPRESS
                and not (isinstance(default, float) and default != default)):
            text += " (default: %(default)s)"
        return text

    def _split_lines(self, text: str, width: int) -> list[str]:
        # names such as bubble-placed or marginal-latency stay whole
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)


def every_parser(parser: argparse.ArgumentParser):
    """`parser` and each of its subcommands' parsers, depth first (argparse keeps them in private
    fields: there is no public list)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from every_parser(child)


def build_parser() -> argparse.ArgumentParser:
    from tokenyard import request, top, up
    from tokenyard.loadgen import cli as loadgen_cli
    from tokenyard.services.admission import cli as admission_cli
    from tokenyard.services.edge import cli as edge_cli
    from tokenyard.services.macro_instance import cli as macro_cli
    from tokenyard.services.priority_queue import cli as queue_cli
    from tokenyard.services.router import cli as router_cli
    from tokenyard.services.worker import cli as worker_cli
    from tokenyard.simulator import cli as sim_cli
    from tokenyard.tuning import cli as tune_cli

    parser = argparse.ArgumentParser(prog="tokenyard", description="Control plane of an LLM serving fleet.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up.register(sub)
    request.register(sub)
    top.register(sub)
    for module in (edge_cli, admission_cli, queue_cli, router_cli, macro_cli, worker_cli, loadgen_cli, sim_cli, tune_cli):
        module.register(sub)
    _add_nats_credentials(sub)
    for p in every_parser(parser):
        p.formatter_class = HelpFormatter
        _name_long_choices(p)
        for action in p._actions:  # a subcommand without a description shows its one-line help
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    child = action.choices[choice.dest]
                    child.description = child.description or choice.help
    return parser


def _name_long_choices(parser: argparse.ArgumentParser, longest: int = 30) -> None:
    """A flag whose choices run long (`--policy`, `--profile`) shows a name in the usage and its
    choices in its help text, which wraps: argparse would print `{a,b,…}` on one line of up to
    180 columns, twice."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or not action.choices or action.metavar is not None:
            continue
        names = ", ".join(map(str, action.choices))
        if len(names) > longest:
            action.metavar = action.dest.upper().replace("-", "_")
            action.help = f"{action.help or ''} (one of: {names})".strip()


def _add_nats_credentials(sub: argparse._SubParsersAction) -> None:
    """Every command that connects to NATS (it has `--nats`, or `--target` for bench) takes
    credentials the same way (shared/nats_auth.py)."""
    from tokenyard.shared import nats_auth

    def walk(parser: argparse.ArgumentParser) -> None:
        options = {s for a in parser._actions for s in a.option_strings}
        if "--nats" in options or "--target" in options:
            nats_auth.add_arguments(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    for child in sub.choices.values():
        walk(child)


def main(argv: Sequence[str] | None = None) -> int:
    from tokenyard.shared import nats_auth

    args = build_parser().parse_args(argv)
    nats_auth.apply_args(args)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
