"""The distribution as setup.py and pyproject.toml declare it: one top-level package
(`tokenyard`), every module of the mapped folders inside it, and every data file the code reads
at run time (traces, calibration, latency tables) declared as package data, so a wheel install
works with no checkout beside it."""

from __future__ import annotations

import fnmatch
import warnings
from pathlib import Path

from tokenyard.data import CALIBRATION, TRACES

ROOT = Path(__file__).resolve().parents[1]


def distribution():
    from distutils.core import run_setup

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_setup(str(ROOT / "setup.py"), script_args=["--name"], stop_after="config")


def installed_name(path: Path, package_dir: dict[str, str]) -> str:
    """The dotted package a repository folder installs as."""
    rel = path.relative_to(ROOT).parts
    for pkg, folder in package_dir.items():
        if rel[: len(Path(folder).parts)] == Path(folder).parts:
            return ".".join([pkg, *rel[len(Path(folder).parts) :]])
    assert rel[0] == "tokenyard", path
    return ".".join(rel)


def test_one_top_level_package_and_every_module_in_it():
    d = distribution()
    assert {p.split(".")[0] for p in d.packages} == {"tokenyard"}
    folders = [ROOT / "tokenyard", *(ROOT / f for f in d.package_dir.values())]
    modules = [p for f in folders for p in f.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(modules) > 100
    missing = sorted({installed_name(m.parent, d.package_dir) for m in modules} - set(d.packages))
    assert missing == []


def test_every_data_file_is_package_data():
    d = distribution()
    files = [p for p in (ROOT / "data").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    files += list((ROOT / "services/worker/sim/data").iterdir())
    assert {p.name for p in TRACES.iterdir()} >= {"mooncake_conversation_trace.jsonl.gz", "README.md"}
    assert (CALIBRATION / "README.md").exists() and len(files) >= 14
    for f in files:
        pkg = installed_name(f.parent, d.package_dir)
        assert pkg in d.packages, f
        assert any(fnmatch.fnmatch(f.name, g) for g in d.package_data.get(pkg, ())), f


def test_no_file_names_a_path_outside_the_repository():
    """The repository stands alone: no tracked file points at the folder beside it that held the
    design's sources, or at the machine it was built on (the two strings are assembled here, so
    this file does not name them itself); and no recorded result names a machine-local /tmp folder."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    beside, machine = b"../" + b"shared/", b"/" + b"work/"
    offenders = []
    for name in filter(None, files):
        path = ROOT / name.decode()
        if not path.is_file() or path.suffix in (".gz", ".png", ".db"):
            continue
        text = path.read_bytes()
        if beside in text or machine in text:
            offenders.append(name.decode())
        elif path.suffix == ".json" and b"/tmp/" in text:  # a result records where it was kept: not here
            offenders.append(name.decode())
    assert offenders == [], offenders
