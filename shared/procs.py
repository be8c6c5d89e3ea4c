"""Child processes that die with their parent.

A fleet started by `tokenyard up` is a tree of processes (nats-server, services, workers the
macro controller provisions). If the parent is killed outright (SIGKILL, OOM) it cannot stop
them, and they would keep serving, orphaned. On Linux each child asks the kernel to send it
SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), so it drains and exits as on Ctrl-C.
The signal follows the thread that forked the child: spawn from the thread that lives as long
as the parent (the event loop's). Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen (None where the platform has no such thing)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return  # not fatal: the child just lives on as before
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), sig)

    return preexec
