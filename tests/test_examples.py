"""The README's runnable examples (examples/), run against a fleet as a reader would run them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
async def test_client_example_streams_gathers_and_aborts(fleet, capsys):
    await load("client").main(fleet.nats_url)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines[0]) == 8  # the streamed text: 8 one-byte tokens
    assert lines[1].startswith("[length: 8 tokens, worker tw")
    assert lines[2].startswith("generate: '") and lines[2].endswith("' (length)")
    reason, tokens = lines[3].removeprefix("aborted: ").split(" after ")
    assert reason == "abort" and 3 <= int(tokens.split()[0]) < 1000


@pytest.mark.e2e
async def test_plain_nats_json_example_prints_every_event(fleet, capsys, tmp_path):
    from tokenyard.shared import nats_auth

    creds = nats_auth.resolve(fleet.nats_url, nats_auth.CLIENT)
    creds_file = tmp_path / "client.creds"
    creds_file.write_text(f'user = "{creds.user}"\npassword = "{creds.password}"\n')
    await load("nats_json").main(fleet.nats_url, str(creds_file))
    events = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["type"] for e in events] == ["accepted", *["chunk"] * 8, "finished"]
    assert [e["seq"] for e in events[1:]] == list(range(9))


def test_examples_without_a_fleet_say_so_in_one_line():
    """A reader who runs an example before `tokenyard up` gets one line naming the URL, not a
    traceback or a reconnect loop (both run at once: each waits out its bounded first connect)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{s.getsockname()[1]}"
    runs = [subprocess.Popen([sys.executable, str(EXAMPLES / f"{name}.py"), url],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("nats_json", "client")]
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 1 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"cannot reach NATS at {url}") and err.rstrip().endswith("tokenyard up")
