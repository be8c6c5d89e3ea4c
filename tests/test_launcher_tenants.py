"""`tokenyard up --tenants FILE` hands the tenant file to admission (who may ask for P0)."""

from __future__ import annotations

import argparse
import asyncio
import os
import tomllib

from tokenyard.services.admission.tenants import load_tenants
from tokenyard.shared.schemas import PriorityClass

from tokenyard.launcher import FleetProcesses
from tokenyard.up import register, run_up

TENANTS = """
[default]
ceiling = "P1"

[tenants.vip]
ceiling = "P0"
"""


def admission_cmd(fleet: FleetProcesses) -> list[str]:
    """The command of the process admission runs in (the queue's, by default: --with-admission)."""
    cmds = dict(fleet.commands())
    return cmds.get("admission") or cmds["queue"]


def test_the_tenant_file_reaches_admission_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "t.toml").write_text(TENANTS)
    monkeypatch.chdir(tmp_path)
    cmd = admission_cmd(FleetProcesses(nats_url="nats://127.0.0.1:4222", tenants="t.toml", metrics=False))
    i = cmd.index("--tenants")
    assert cmd[i + 1] == os.path.join(str(tmp_path), "t.toml")
    with open(cmd[i + 1], "rb") as f:
        assert load_tenants(tomllib.load(f)).tenants["vip"].ceiling == PriorityClass.P0
    assert "--tenants" not in admission_cmd(FleetProcesses(nats_url="nats://x:1", metrics=False))


def test_a_missing_tenant_file_stops_up_before_anything_starts(tmp_path, capsys):
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    args = p.parse_args(["up", "--tenants", str(tmp_path / "none.toml")])
    assert asyncio.run(run_up(args)) == 2
    assert "--tenants: no such file" in capsys.readouterr().err


def test_up_passes_the_simulated_workers_scheduling_policy():
    cmds = dict(FleetProcesses(nats_url="nats://x:1", workers=2, scheduling="scorpio", metrics=False).commands())
    for name in ("worker-0", "worker-1"):
        i = cmds[name].index("--scheduling")
        assert cmds[name][i + 1] == "scorpio"
    vllm = dict(FleetProcesses(nats_url="nats://x:1", workers=1, engine="vllm", metrics=False).commands())
    assert "--scheduling" not in vllm["worker-0"]  # a vLLM worker schedules as vLLM does


def test_up_with_macro_scale_passes_the_scheduling_policy_to_the_workers_the_macro_starts():
    from tokenyard.up import macro_args

    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    args = p.parse_args(["up", "--macro-scale", "--scheduling", "scorpio"])
    macro = macro_args(args)
    assert macro[macro.index("--worker-scheduling") + 1] == "scorpio"
    assert "--worker-scheduling" not in macro_args(p.parse_args(["up", "--scheduling", "scorpio"]))
