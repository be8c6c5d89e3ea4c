"""Another commit's code, importable as `tokenyard`, to measure beside this tree's.

    with baseline_env("main") as env:          # env = {"PYTHONPATH": …}
        FleetProcesses(..., extra_env=env)      # that fleet's services run main's code

`git archive REF` is unpacked into a temporary folder and laid out as the installed package
is (setup.py maps services/, shared/, … under `tokenyard`): a `tokenyard/` folder holding
the ref's own `tokenyard/` files with links to its mapped folders. A child started with that
folder first on PYTHONPATH imports the ref's code: Python's path finder runs before the
editable install's finder. Two fleets, one on each tree, measured with interleaved requests
see the same machine at the same moments, which on a shared machine is the only fair
before/after.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAPPED = ("services", "shared", "loadgen", "simulator", "tuning", "data")
"""The folders setup.py installs under `tokenyard` (its MAPPED)."""


def commit_of(ref: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"not a commit here: {ref!r} ({out.stderr.strip()})")
    return out.stdout.strip()


def has_text(ref: str, path: str, text: str) -> bool:
    """Whether `ref`'s file `path` holds `text` (an option an older commit lacks)."""
    out = subprocess.run(["git", "-C", str(REPO), "show", f"{commit_of(ref)}:{path}"], capture_output=True, text=True)
    return out.returncode == 0 and text in out.stdout


@contextlib.contextmanager
def baseline_env(ref: str) -> Iterator[dict[str, str]]:
    """The environment under which a child process imports `ref`'s tokenyard."""
    commit = commit_of(ref)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix=f"tokenyard-{commit[:10]}-") as tmp:
        src, pkg = Path(tmp, "src"), Path(tmp, "pkg")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
        (pkg / "tokenyard").mkdir(parents=True)
        for f in (src / "tokenyard").iterdir():
            (pkg / "tokenyard" / f.name).symlink_to(f)
        for name in MAPPED:
            if (src / name).is_dir():
                (pkg / "tokenyard" / name).symlink_to(src / name, target_is_directory=True)
        path = os.pathsep.join(p for p in (str(pkg), os.environ.get("PYTHONPATH", "")) if p)
        # PYTHONSAFEPATH: `python -m` would otherwise put the current folder (this repo) first.
        yield {"PYTHONPATH": path, "PYTHONSAFEPATH": "1", "TOKENYARD_CODE": commit}
