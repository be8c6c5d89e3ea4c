"""How the macro-instance controller adds and removes workers (mitosis scaling's hands).

The controller's core only says "one more worker for macro-instance m" or "stop worker w"
(ProvisionOp); a Provisioner does it. A new worker is not named in advance: it joins the
macro-instance that asked for it once its heartbeats arrive. A removed worker has already
been drained and taken out of its group by the core.

* LocalProcessProvisioner: `tokenyard worker` child processes on this machine (what
  `tokenyard up` starts); removal sends SIGTERM, on which a worker finishes its in-flight
  requests before it exits. Workers it did not start are only drained, not stopped.
* The cluster simulator provides its own (simulated instances on its virtual clock).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Protocol

from tokenyard.shared import config, nats_auth, telemetry
from tokenyard.shared.procs import die_with_parent

log = telemetry.logger("macro")


class Provisioner(Protocol):
    def add(self, macro_id: str) -> None:
        """Start one worker; it joins `macro_id` once its heartbeats arrive."""

    def remove(self, worker_id: str) -> None:
        """Stop a worker the core has drained and taken out of its group."""


@dataclass
class NoProvisioner:
    """Scaling decisions are logged, nothing is started or stopped (the default)."""

    def add(self, macro_id: str) -> None:
        log.info("scale_add_skipped", macro=macro_id, why="no provisioner")

    def remove(self, worker_id: str) -> None:
        log.info("scale_remove_skipped", worker=worker_id, why="no provisioner")


@dataclass
class LocalProcessProvisioner:
    nats_url: str
    engine: str = "sim"
    profile: str = "a100-llama3-8b"
    speed: float = 1.0
    model: str = config.DEFAULT_MODEL
    scheduling: str = "vllm"
    """A simulated worker's engine policy (`tokenyard worker --scheduling`), as `up` gave its own."""
    id_prefix: str = "ws"
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _next: int = 0

    def command(self, worker_id: str) -> list[str]:
        return [sys.executable, "-m", "tokenyard.cli", "worker", "--nats", self.nats_url, "--engine", self.engine,
                "--profile", self.profile, "--speed", str(self.speed), "--id", worker_id, "--model", self.model,
                *(["--scheduling", self.scheduling] if self.engine == "sim" and self.scheduling != "vllm" else [])]

    def add(self, macro_id: str) -> None:
        wid = f"{self.id_prefix}{self._next}"
        self._next += 1
        env = {**os.environ, **nats_auth.child_env(self.nats_url, "worker")}
        self.procs[wid] = subprocess.Popen(self.command(wid), env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, preexec_fn=die_with_parent())
        log.info("worker_started", worker=wid, macro=macro_id, pid=self.procs[wid].pid)

    def remove(self, worker_id: str) -> None:
        p = self.procs.pop(worker_id, None)
        if p is None:
            log.info("worker_drained_only", worker=worker_id, why="not started by this provisioner")
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        log.info("worker_stopping", worker=worker_id, pid=p.pid)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every worker this provisioner started (SIGTERM, then SIGKILL after a wait)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
