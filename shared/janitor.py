"""Temporary directories and files that go when this process goes, however it goes.

`tokenyard up` keeps a nats-server's store and config (the fleet users' passwords), the fleet's
credentials and the edge processes' metrics files under the system's temporary directory, and
copies of two creds files where this machine's commands look. Stopped, it removes them; killed
outright (SIGKILL, the OOM killer) it cannot, and they would stay. So the first path handed to
`watch` starts a small sweeper process that reads paths (and the pids of processes that write in
them) from a pipe. The pipe closes when this process ends, whichever way: the sweeper then waits
for those processes to exit (they die with their parent, shared/procs.py) — at most WAIT_S, after
which it removes the paths anyway — removes each path (a file's folder too, once empty), and
ends. After a clean stop the paths are gone already and it has nothing to do.
"""

from __future__ import annotations

import os
import subprocess
import sys

WAIT_S = 10.0
"""How long the sweeper waits for the processes it was told of before it removes the paths."""
TAG = "tokenyard-janitor"
"""The sweeper's last argument: what tells it from the processes that die with their parent."""

_SWEEPER = r"""
import os, shutil, sys, time
paths, pids = [], []
for line in sys.stdin.buffer:
    kind, _, value = line.rstrip(b"\n").partition(b" ")
    (paths if kind == b"path" else pids).append(os.fsdecode(value))
def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return False
    except OSError:
        return False
    try:  # no /proc: signal 0 tells whether it exists
        os.kill(int(pid), 0)
        return True
    except OSError:
        return False
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end and any(running(p) for p in pids):
    time.sleep(0.05)
for path in paths:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)
            os.rmdir(os.path.dirname(path))  # its folder, once empty (another's file keeps it)
    except OSError:
        pass
"""

_sweeper: subprocess.Popen | None = None


def watch(path: str | None = None, pid: int | None = None) -> None:
    """Remove `path` (a directory, or a file) once this process has ended, after `pid` (a process
    writing there) has exited. Best effort, never raises: where no sweeper can start, the owner's
    own clean-up is all there is."""
    global _sweeper
    try:
        if _sweeper is None or _sweeper.poll() is not None:
            # its own session: a Ctrl-C to the terminal's group stops this process, not the sweeper
            _sweeper = subprocess.Popen([sys.executable, "-S", "-c", _SWEEPER, str(WAIT_S), TAG],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        lines = (b"path " + os.fsencode(path) + b"\n" if path else b"") + (f"pid {pid}\n".encode() if pid else b"")
        _sweeper.stdin.write(lines)
        _sweeper.stdin.flush()
    except Exception:  # noqa: BLE001 (best effort: a sweeper that cannot start or be told changes nothing)
        pass
