"""`python -m bench.NAME --help`: every flag of every bench script says what it does, as
`tokenyard`'s own CLI does (tests/test_cli_help.py) — 142 of them printed a bare name before.

The scripts' parsers are built inside their `main`s, next to the code they drive, so the
check is on the source: every `add_argument` call of an option has a non-empty `help=`. A few
scripts whose `--help` runs without side effects are also run, to see the texts printed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"


def add_argument_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]


def names(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def help_arg(call: ast.Call) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == "help"), None)


def literal_head(node: ast.expr) -> str:
    """The help's text up to its first part computed at run time or filled in by argparse
    (`%(default)s`), with argparse's `%%` as printed: what `--help` must show verbatim."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):  # an f-string: its leading literal part
        first = node.values[0] if node.values else None
        text = first.value if isinstance(first, ast.Constant) else ""
    else:
        return ""
    return text.split("%(")[0].replace("%%", "%")


def test_the_walk_finds_the_bench_scripts_flags():
    calls = [c for p in BENCH.rglob("*.py") for c in add_argument_calls(p)]
    assert len(calls) > 250  # every script's parser, bench/faults' included
    assert any("--probe" in names(c) for c in add_argument_calls(BENCH / "faults" / "__main__.py"))


def test_every_bench_option_has_a_help_text():
    bare = []
    for path in sorted(BENCH.rglob("*.py")):
        for call in add_argument_calls(path):
            opts = [n for n in names(call) if n.startswith("-")]
            if not opts:
                continue
            h = help_arg(call)
            empty = isinstance(h, ast.Constant) and not (isinstance(h.value, str) and h.value.strip())
            if h is None or empty:
                bare.append(f"{path.relative_to(REPO)}:{call.lineno} {opts[0]}")
    assert not bare, f"{len(bare)} bench flags without help:\n" + "\n".join(bare)


def squeezed(text: str) -> str:
    """Without any whitespace: argparse wraps the help at spaces and after hyphens."""
    return "".join(text.split())


@pytest.mark.parametrize("module, source", [
    ("bench.admission_refusal", "admission_refusal.py"),
    ("bench.bubble", "bubble.py"),
    ("bench.control_plane", "control_plane.py"),
    ("bench.faults", "faults/__main__.py"),
])
def test_help_prints_each_flag_with_its_text(module, source):
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    printed = squeezed(out.stdout)
    shown = 0
    for call in add_argument_calls(BENCH / source):
        opts = [n for n in names(call) if n.startswith("-")]
        h = help_arg(call)
        if not opts or h is None or (isinstance(h, ast.Attribute) and h.attr == "SUPPRESS"):
            continue
        assert opts[0] in out.stdout, (module, opts[0])
        head = squeezed(literal_head(h))
        assert head in printed, (module, opts[0], head)
        shown += bool(head)
    assert shown >= 1
    if module != "bench.admission_refusal":
        assert "(default:" in out.stdout  # defaults are shown where there are some


def test_no_bench_option_defaults_to_a_folder_of_this_machine():
    """A bench's default is the same on every machine: a log folder nobody asked for is a new
    temporary one (bench/_out.log_dir), not a fixed path under /tmp (four benches had one)."""
    fixed = [f"{path.relative_to(REPO)}: {names(call)}"
             for path in sorted(BENCH.rglob("*.py")) for call in add_argument_calls(path)
             for k in call.keywords
             if k.arg == "default" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)
             and k.value.value.startswith("/")]
    assert fixed == []


def test_a_log_folder_nobody_asked_for_is_a_new_one_each_run(tmp_path, capsys):
    from bench._out import log_dir
    first, second = log_dir(None, "x"), log_dir(None, "x")
    try:
        assert first != second and first.is_dir() and second.is_dir() and first.name.startswith("tokenyard-x-")
        assert capsys.readouterr().err.split() == ["logs:", str(first), "logs:", str(second)]
        assert log_dir(str(tmp_path / "a" / "b"), "x") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    finally:
        first.rmdir()
        second.rmdir()
