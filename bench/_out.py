"""A bench's result file: the document a bench writes to its --out / --json path, the command
that produced it recorded inside, so every figure in docs/ can be traced to its command.

Strict JSON (loadgen.report.write_result_json: non-finite numbers as the strings "inf" /
"nan", objects JSON has no type for by their str), the parent folders made.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from tokenyard.loadgen.report import write_result_json


def command(prog: str, argv: list[str] | None = None) -> str:
    """The command line as typed: `prog`, then `argv` (this process's arguments when None)."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def write_result(path: str | Path | None, doc: Any, prog: str | None = None, argv: list[str] | None = None) -> None:
    """Write `doc` to `path` (nothing when no path was given); with `prog`, a dict `doc` gets
    the command that produced it under "command"."""
    if not path:
        return
    if prog is not None:
        doc = {"command": command(prog, argv), **doc}
    write_result_json(doc, path)


def log_dir(asked: str | None, bench: str) -> Path:
    """Where a bench keeps its processes' logs: the folder asked for (made), else a new temporary
    one, named on stderr."""
    if asked:
        path = Path(asked)
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(tempfile.mkdtemp(prefix=f"tokenyard-{bench}-"))
    print(f"logs: {path}", file=sys.stderr)
    return path
