"""shared/janitor.py: a watched directory is removed once its process has ended — killed
outright too — after the processes writing in it have exited."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tests.conftest import until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def watching(path, pid: int | None = None) -> subprocess.Popen:
    """A process that hands `path` (and `pid`) to the janitor, says so, and sleeps."""
    script = ("import time; from tokenyard.shared import janitor; "
              f"janitor.watch({str(path)!r}, {pid!r}); print('watching', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"watching\n"
    return proc


async def test_a_watched_directory_goes_when_its_process_is_killed_outright(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "nats.conf").write_text("passwords")
    parent = watching(store)
    assert store.exists()
    parent.kill()  # SIGKILL: no clean-up of its own runs
    parent.wait()
    await until(lambda: not store.exists(), timeout_s=20, what="the sweeper removes the directory")


async def test_the_directory_stays_while_a_process_that_writes_in_it_runs(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    writer = subprocess.Popen(["sleep", "120"])
    parent = watching(store, writer.pid)
    parent.kill()
    parent.wait()
    await asyncio.sleep(1.0)
    assert store.exists()  # the writer still runs: the sweeper waits for it (up to janitor.WAIT_S)
    writer.kill()
    writer.wait()
    await until(lambda: not store.exists(), timeout_s=20, what="the sweeper removes the directory")


async def test_a_watched_file_goes_and_its_folder_once_empty(tmp_path):
    folder = tmp_path / "tokenyard" / "nats-4222"
    folder.mkdir(parents=True)
    creds = folder / "client.creds"
    creds.write_text("secret")
    kept = tmp_path / "tokenyard" / "other"
    kept.mkdir()
    (kept / "mine").write_text("someone else's")
    parent = watching(creds)
    parent.kill()
    parent.wait()
    await until(lambda: not folder.exists(), timeout_s=20, what="the file and its emptied folder go")
    assert (kept / "mine").read_text() == "someone else's"  # nothing else is touched
