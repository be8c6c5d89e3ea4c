"""The thin runtime every service shell runs in: connect to NATS, register a `nats.micro`
service (so `$SRV.PING` / `$SRV.INFO` / `$SRV.STATS` find it), start the shell, wait for
SIGINT/SIGTERM or `stop()`, then let the shell drain its in-flight work and drain NATS.

The same host runs a shell in its own process (`tokenyard router --nats URL`) or inside a
test's event loop next to other shells, each with its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Protocol

import nats.micro
from nats.aio.client import Client
from nats.micro.service import Service
from tokenyard.shared import natsutil, telemetry

VERSION = "0.1.0"


class Shell(Protocol):
    kind: str
    """The service kind: `admission`, `router`, … (micro name `tokenyard-<kind>`)."""
    instance_id: str

    async def start(self, nc: Client, service: Service) -> None:
        """Subscribe and add micro endpoints; return once serving."""

    async def stop(self) -> None:
        """Stop taking work and finish what is in flight."""


def new_instance_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


class ServiceHost:
    def __init__(self, shell: Shell, nats_url: str):
        self.shell = shell
        self.nats_url = nats_url
        self.nc: Client | None = None
        self.service: Service | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> ServiceHost:
        telemetry.setup(self.shell.kind)
        self.nc = await natsutil.connect(self.nats_url, name=self.shell.instance_id, kind=self.shell.kind)
        self.service = await nats.micro.add_service(
            self.nc,
            name=f"tokenyard-{self.shell.kind}",
            version=VERSION,
            description=f"tokenyard {self.shell.kind}",
            metadata={"instance": self.shell.instance_id},
        )
        await self.shell.start(self.nc, self.service)
        await self.nc.flush()  # the server has every subscription: started means serving
        telemetry.logger(self.shell.kind).info("started", instance=self.shell.instance_id, nats=self.nats_url)
        return self

    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self.shell.stop()
        if self.service:
            with contextlib.suppress(Exception):
                await self.service.stop()
        if self.nc and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    async def run_until_signalled(self) -> None:
        """Serve until SIGINT / SIGTERM, then drain and stop. The handlers go in first: a
        signal that arrives while starting (a worker heartbeats before start returns) still
        means drain and exit 0, not death by the default handler."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        telemetry.logger(self.shell.kind).info("stopping", instance=self.shell.instance_id)
        await self.stop()


def run(shell: Shell, nats_url: str) -> None:
    """Entry point of a service process."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(ServiceHost(shell, nats_url).run_until_signalled())
