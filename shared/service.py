"""The thin runtime every service shell runs in: connect to NATS, register a `nats.micro`
service (so `$SRV.PING` / `$SRV.INFO` / `$SRV.STATS` find it), start the shell, wait for
SIGINT/SIGTERM or `stop()`, then let the shell drain its in-flight work and drain NATS — while
the connection carries what the drain sends: one down for BUS_GONE_S (`tokenyard up` killed
outright takes nats-server with its services) stops at once, for its work can reach nobody.

A shell that has `metrics` (shared/metrics.py) gets them served on `GET /metrics` at
`metrics_port` when one is given, and their `snapshot()` in `$SRV.STATS` as each endpoint's
`data` (what `tokenyard top` reads). A shell's per-request state goes there too: `kept()`, the
entries of each container that holds something per request (0 again once every request here
ended), and `remembered()`, each memory kept on purpose and bounded (name → [entries, bound];
bound None: bounded by time, not count): what bench/soak.py watches for state that grows.

The same host runs a shell in its own process (`tokenyard router --nats URL`) or inside a
test's event loop next to other shells, each with its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Protocol

from nats.aio.client import Client
from nats.micro.service import Service, ServiceConfig
from tokenyard.shared import metrics, natsutil, subjects, telemetry

VERSION = "0.1.0"

STOP_BOUND_S: float | None = None
"""How long `ServiceHost.stop()` may take. Past it the host logs where the stop and every other
pending task wait (`stop_overran`), keeps that text in `overran`, and closes its connection, so
the bus sees the service gone. None, a process's default: no bound (a draining worker lets its
generations finish, however long they take). The tests set one: a stop that hangs must not leave
a fleet answering on the session's shared server."""


BUS_GONE_S = natsutil.IDLE_RECONNECT_BOUND_S
"""A stop whose connection has been down (not connected: reconnecting, an attempt in flight to a
silent address, or closed) this long ends without its drain: the edge's HTTP streams and a
worker's generations have nobody left to reach, and would otherwise hold their clients (aiohttp's
60 s shutdown) and the process (a generation's whole length) for nothing. A NATS restart within it
costs the drain nothing."""

CUT_OFF_S = 1.0
"""How long a shell's `cut_off()` may take: what it ends then is told at once, by a call."""

BUS_POLL_S = 0.1


class Shell(Protocol):
    kind: str
    """The service kind: `admission`, `router`, … (micro name `tokenyard-<kind>`)."""
    instance_id: str

    async def start(self, nc: Client, service: Service) -> None:
        """Subscribe and add micro endpoints; return once serving."""

    async def stop(self) -> None:
        """Stop taking work and finish what is in flight."""

    # optional: kept() -> dict[str, int], remembered() -> dict[str, tuple[int, int | None]] (module header);
    # async cut_off(): the stop is cut for the bus (BUS_GONE_S): end now, honestly, what would be
    # lost unsaid with the connection (admission: the hand-overs it answered `accepted` by a call)


def new_instance_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


class InboxOnlyService(Service):
    """nats.micro's service answering `$SRV.PING` / `INFO` / `STATS` on an inbox only
    (subjects.is_inbox): the read-only `observer` may ask them, and every service's answer on
    `$KV.tokenyard_topology.<key>` would overwrite the topology the macro controller keeps."""

    async def _handle_ping_request(self, msg) -> None:
        if subjects.is_inbox(msg.reply):
            await super()._handle_ping_request(msg)

    async def _handle_info_request(self, msg) -> None:
        if subjects.is_inbox(msg.reply):
            await super()._handle_info_request(msg)

    async def _handle_stats_request(self, msg) -> None:
        if subjects.is_inbox(msg.reply):
            await super()._handle_stats_request(msg)


class ServiceHost:
    def __init__(self, shell: Shell, nats_url: str, metrics_port: int | None = None,
                 metrics_host: str = "0.0.0.0"):
        self.shell = shell
        self.nats_url = nats_url
        self.metrics_port = metrics_port
        """None: no /metrics endpoint; 0: a free port (`metrics_url` tells which)."""
        self.metrics_host = metrics_host
        self.metrics_url: str | None = None
        self.nc: Client | None = None
        self.service: Service | None = None
        self._metrics_runner = None
        self._stopped = asyncio.Event()
        self.overran: str | None = None
        """Set when stop() passed STOP_BOUND_S: where it and the other pending tasks waited."""

    async def start(self) -> ServiceHost:
        telemetry.setup(self.shell.kind)
        self.nc = await natsutil.connect(self.nats_url, name=self.shell.instance_id, kind=self.shell.kind)
        self.service = InboxOnlyService(self.nc, ServiceConfig(
            name=f"tokenyard-{self.shell.kind}",
            version=VERSION,
            description=f"tokenyard {self.shell.kind}",
            metadata={"instance": self.shell.instance_id},
            stats_handler=self._stats_data,
        ))
        await self.shell.start(self.nc, self.service)
        await self.nc.flush()  # the server has every subscription before anyone is told we serve
        # Only now does the service answer $SRV.PING: one that fails in start (an HTTP port in
        # use) is never counted as up by `tokenyard up`'s readiness check.
        await self.service.start()
        shell_metrics = getattr(self.shell, "metrics", None)
        if self.metrics_port is not None and shell_metrics is not None:
            self._metrics_runner = await metrics.serve(shell_metrics.registry, self.metrics_port, self.metrics_host)
            host = "127.0.0.1" if self.metrics_host in ("0.0.0.0", "") else self.metrics_host
            self.metrics_url = f"http://{host}:{metrics.bound_port(self._metrics_runner)}/metrics"
        telemetry.logger(self.shell.kind).info("started", instance=self.shell.instance_id, nats=self.nats_url)
        return self

    def _stats_data(self, _endpoint) -> dict:
        snapshot = getattr(getattr(self.shell, "metrics", None), "snapshot", None)
        data = snapshot() if snapshot is not None else {}
        for part in ("kept", "remembered"):
            if (count := getattr(self.shell, part, None)) is not None:
                data[part] = count()
        return data

    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        steps = asyncio.ensure_future(self._stop_steps())
        try:
            cut = await self._cut_short(steps)
        except asyncio.CancelledError:
            steps.cancel()  # the stop's caller was cancelled: so is the stop
            raise
        if cut is None:
            return steps.result()
        if cut == "bus":
            telemetry.logger(self.shell.kind).warning("stop_without_nats", down_s=BUS_GONE_S)
            if (cut_off := getattr(self.shell, "cut_off", None)) is not None:
                with contextlib.suppress(Exception):  # what it could not end in time is cut below
                    await asyncio.wait_for(cut_off(), CUT_OFF_S)
        else:
            self._overran(steps)
        steps.cancel()
        await asyncio.wait({steps}, timeout=1.0)  # a stop that swallows the cancellation is left behind
        with contextlib.suppress(Exception):
            if self._metrics_runner is not None:
                await self._metrics_runner.cleanup()  # its port is free again
            if self.nc and not self.nc.is_closed:
                await self.nc.close()

    async def _cut_short(self, steps: asyncio.Future) -> str | None:
        """None once `steps` end; "bound" past STOP_BOUND_S; "bus" once the connection has been
        down BUS_GONE_S."""
        loop = asyncio.get_running_loop()
        end = loop.time() + (STOP_BOUND_S if STOP_BOUND_S is not None else float("inf"))
        down_since: float | None = None
        while not steps.done():
            now = loop.time()
            if now >= end:
                return "bound"
            if self.nc is None or self.nc.is_connected or self.nc.is_draining:  # down: reconnecting, closed,
                down_since = None  # or an attempt in flight (CONNECTING: to a partition's silent address, ≤ 5 s)
            elif down_since is None:
                down_since = now
            elif now - down_since >= BUS_GONE_S:
                return "bus"
            await asyncio.wait({steps}, timeout=min(BUS_POLL_S, end - now))
        return None

    def _overran(self, steps: asyncio.Future) -> None:
        try:
            self.overran = f"{self.shell.kind} {self.shell.instance_id}: stop waits at " + " / ".join(
                [await_chain(steps), *(await_chain(t) for t in asyncio.all_tasks() if t is not steps
                                       and t is not asyncio.current_task())])
        except Exception as e:  # noqa: BLE001 (the diagnosis must not keep the service on the bus)
            self.overran = f"{self.shell.kind} {self.shell.instance_id}: stop overran (no diagnosis: {e!r})"
        telemetry.logger(self.shell.kind).error("stop_overran", bound_s=STOP_BOUND_S, where=self.overran)

    async def _stop_steps(self) -> None:
        await self.shell.stop()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self.service:
            with contextlib.suppress(Exception):
                await self.service.stop()
        if self.nc and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        if self.nc and not self.nc.is_closed:  # the drain refused (no connection): closed all the same,
            with contextlib.suppress(Exception):  # or it reconnects later and sends what this stop left in
                await self.nc.close()  # its buffer (a close over a dead transport raises its reset)

    async def run_until_signalled(self) -> None:
        """Serve until SIGINT / SIGTERM, then drain and stop. The handlers go in before start():
        a worker is visible (its first heartbeat) before start() returns, and a SIGTERM sent as
        soon as it is seen must drain it, not kill it."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        telemetry.logger(self.shell.kind).info("stopping", instance=self.shell.instance_id)
        await self.stop()


def await_chain(task: asyncio.Future) -> str:
    """Where a pending task waits: its coroutines, outermost first, as `name:line`, down to the
    future it awaits (Task.get_stack shows only the outermost frame of a suspended task)."""
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    chain = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        chain.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(chain) or repr(task)


async def serve_together(hosts: list[ServiceHost]) -> None:
    """Several services in one process (a queue and its router), each on its own NATS
    connection, as its own user: started in order, serving until SIGINT / SIGTERM, stopped in
    reverse order (the queue's routes in flight finish while its router still serves)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before start(): see run_until_signalled
        loop.add_signal_handler(sig, stop.set)
    started: list[ServiceHost] = []
    try:
        for host in hosts:
            started.append(await host.start())
        await stop.wait()
        for host in reversed(started):
            telemetry.logger(host.shell.kind).info("stopping", instance=host.shell.instance_id)
    finally:
        for host in reversed(started):
            await host.stop()


def run(shell: Shell, nats_url: str, metrics_port: int | None = None,
        also: list[tuple[Shell, int | None]] | None = None, name: str | None = None) -> None:
    """Entry point of a service process; `also`: services started before it in the same
    process, (shell, its metrics port); `name`: the command, in an error (default: the shell's kind)."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    hosts = [ServiceHost(s, nats_url, port) for s, port in also or []]
    try:
        if hosts:
            asyncio.run(serve_together([*hosts, ServiceHost(shell, nats_url, metrics_port)]))
        else:
            asyncio.run(ServiceHost(shell, nats_url, metrics_port).run_until_signalled())
    except OSError as e:  # "cannot reach NATS at …", "address already in use": a message, not a traceback
        raise SystemExit(f"tokenyard {name or shell.kind}: error: {e}") from None
