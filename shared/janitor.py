"""Temporary directories that go when this process goes, however it goes.

`tokenyard up` keeps a nats-server's store and config (the fleet users' passwords), the fleet's
credentials and the edge processes' metrics files under the system's temporary directory. Stopped,
it removes them; killed outright (SIGKILL, the OOM killer) it cannot, and they would stay. So the
first path handed to `watch` starts a small sweeper process that reads directory names (and
the pids of processes that write in them) from a pipe. The pipe closes when this process ends,
whichever way: the sweeper then waits for those processes to exit (they die with their parent,
shared/procs.py), at most WAIT_S, and removes the directories — already gone after a clean stop.
"""

from __future__ import annotations

import subprocess
import sys

WAIT_S = 10.0
"""How long the sweeper waits for the processes it was told of before it removes the directories."""
TAG = "tokenyard-janitor"
"""The sweeper's last argument: what tells it from the processes that die with their parent."""

_SWEEPER = r"""
import os, shutil, sys, time
paths, pids = [], []
for line in sys.stdin:
    kind, _, value = line.rstrip("\n").partition(" ")
    (paths if kind == "path" else pids).append(value)
def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end and any(running(p) for p in pids):
    time.sleep(0.05)
for path in paths:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
"""

_sweeper: subprocess.Popen | None = None


def watch(path: str | None = None, pid: int | None = None) -> None:
    """Remove `path` (a directory, or a file) once this process has ended, after `pid` (a process writing there) has
    exited. Best effort: where no sweeper can start, the owner's own clean-up is all there is."""
    global _sweeper
    if _sweeper is None or _sweeper.poll() is not None:
        try:  # its own session: a Ctrl-C to the terminal's group stops this process, not the sweeper
            _sweeper = subprocess.Popen([sys.executable, "-S", "-c", _SWEEPER, str(WAIT_S), TAG], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return
    lines = (f"path {path}\n" if path else "") + (f"pid {pid}\n" if pid else "")
    try:
        _sweeper.stdin.write(lines.encode())
        _sweeper.stdin.flush()
    except OSError:
        pass
