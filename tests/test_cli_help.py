"""`tokenyard … --help`: every subcommand has a description, every flag a help text, and the
help shows each flag's default (unless the text says it itself)."""

from __future__ import annotations

import argparse

from tokenyard.cli import build_parser, every_parser


def test_every_flag_of_every_command_is_described():
    parsers = list(every_parser(build_parser()))
    assert {p.prog for p in parsers} >= {f"tokenyard {c}" for c in ("up", "request", "sim", "tune", "bench serve")}
    for p in parsers:
        assert p.description, p.prog
        for a in p._actions:  # argparse's: no public list of a parser's flags
            if not isinstance(a, argparse._SubParsersAction):  # its choices are checked as parsers
                assert a.help, (p.prog, a.option_strings or a.dest)


def test_defaults_are_shown():
    parser = build_parser()
    up = next(p for p in every_parser(parser) if p.prog == "tokenyard up")
    text = " ".join(up.format_help().split())
    assert "(default: 2)" in text  # --workers
    assert "(default: 0)" in text  # --bench-prompts: 0 is a default, not "no default"
    assert "default: 4222 if free" in text  # said by the flag itself, not twice
    assert "(default: None)" not in text and "(default: False)" not in text
    assert isinstance(up.formatter_class(prog="x"), argparse.HelpFormatter)


def test_every_help_fits_100_columns_and_keeps_names_whole(monkeypatch):
    """argparse printed `{multiplicative,multiplicative-exact,…}` on one line of up to 180
    columns (twice per flag); long choice lists are now a name in the usage and a wrapped list
    in the flag's help, and a name such as `bubble-placed` is never split at its hyphen."""
    from tokenyard.services.priority_queue.policies.registry import POLICY_NAMES
    from tokenyard.services.router.core import POLICIES

    for columns in ("100", "80"):
        monkeypatch.setenv("COLUMNS", columns)
        for p in every_parser(build_parser()):
            text = p.format_help()
            assert max(map(len, text.splitlines())) <= 100, (p.prog, columns)
            for name in (*POLICY_NAMES, *POLICIES):
                if "-" in name:
                    head = name.split("-")[0] + "-\n"
                    assert head not in text, (p.prog, name)
    up = next(p for p in every_parser(build_parser()) if p.prog == "tokenyard up")
    text = " ".join(up.format_help().split())
    assert "--policy POLICY" in text and "(one of: multiplicative, multiplicative-exact," in text
