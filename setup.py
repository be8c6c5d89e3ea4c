"""Packaging: the distribution owns one top-level package, `tokenyard`. The folders keep the
layout the README shows (services/, shared/, loadgen/, simulator/, tuning/, data/ beside
tokenyard/) and are installed under it: services/ becomes `tokenyard.services`, data/ (traces,
calibration) `tokenyard.data`, and so on. Metadata lives in pyproject.toml; only this mapping
needs code (setuptools' `find` cannot add a prefix)."""

from setuptools import find_packages, setup

MAPPED = ("services", "shared", "loadgen", "simulator", "tuning", "data")

DATA_DIRS = ("data.traces", "data.calibration", "data.licenses", "services.worker.sim.data")
"""Folders of data files only: listed as packages (their files are package data), as setuptools
asks of any importable folder it ships."""

packages = find_packages(include=["tokenyard", "tokenyard.*"])
for root in MAPPED:
    packages += [f"tokenyard.{name}" for name in find_packages(include=[root, f"{root}.*"])]
packages += [f"tokenyard.{name}" for name in DATA_DIRS]

setup(packages=packages, package_dir={f"tokenyard.{root}": root for root in MAPPED})
