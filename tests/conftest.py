"""Test fixtures: a real nats-server per test session, and an in-process fleet (every
service's shell in this event loop, each with its own NATS connection) for end-to-end tests
that also need to see spans. Process-level tests use tokenyard.launcher.FleetProcesses."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import settings  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from tokenyard.shared import nats_auth, natsutil, service  # noqa: E402

# No wall-clock limit on a property's example (hypothesis's default is 200 ms): these machines
# are shared and noisy, and speed is the benchmarks' to judge, not a unit test's. A property
# that failed only by its example's time once under CI's load (test_metrics' macro gauges).
settings.register_profile("tokenyard", deadline=None)
settings.load_profile("tokenyard")

SPANS = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(_provider)
os.environ.setdefault("TOKENYARD_LOG_LEVEL", "WARNING")
# A service's stop that hangs closes its connection after this, instead of leaving its fleet
# answering other tests on the session's server (see stop_hosts).
service.STOP_BOUND_S = 15.0


CLIENT_USERS = ("client", "alice", "bob")
"""Client users of the session's server besides the services' own (tests of inbox isolation)."""


@pytest.fixture(scope="session")
async def nats_server(tmp_path_factory):
    """A nats-server secured as `tokenyard up` secures it: one user per service kind with its
    permissions (shared/nats_auth.py). This process holds the keys, so a test's plain
    `natsutil.connect(url, …)` is the operator (admin), a shell in the in-process fleet
    connects as its kind, and `TokenyardClient.connect` as the user `client`."""
    auth = nats_auth.FleetAuth.generate(tmp_path_factory.mktemp("nats-creds"), clients=CLIENT_USERS)
    server = await natsutil.NatsServer(auth=auth).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def plain_nats():
    """An open nats-server (no users) of the test module's own: its fake services must not answer
    other modules' fleets (a plain subscription on llm.v1.submit would), nor a real fleet answer
    them."""
    server = await natsutil.NatsServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    return SPANS


@dataclass
class InProcFleet:
    nats_url: str
    nats: object
    hosts: list = field(default_factory=list)
    workers: list = field(default_factory=list)

    async def add(self, shell):
        from tokenyard.shared.service import ServiceHost

        host = await ServiceHost(shell, self.nats_url).start()
        self.hosts.append(host)
        return host

    async def stop(self):
        await stop_hosts(self.hosts)


async def stop_hosts(hosts) -> None:
    """Stop `hosts` in reverse order, every one even if one's stop raises (the first error is
    raised once all are stopped). One whose stop passed service.STOP_BOUND_S was cut off (its
    connection closed); where it hung is given as a warning, shown in the run's summary. Six hosts
    cut off take 90 s, within pytest-timeout's 180 s."""
    import warnings

    error: BaseException | None = None
    for host in reversed(hosts):
        try:
            await host.stop()
        except Exception as e:  # noqa: BLE001 (raised below, once the rest are stopped)
            error = error or e
        if host.overran:
            warnings.warn(f"stop overran {service.STOP_BOUND_S} s: {host.overran}", stacklevel=2)
    if error is not None:
        raise error


async def start_inproc_fleet(url: str, workers: int = 2, profile: str = "zero", speed: float = 1.0,
                             policy: str = "least-loaded", num_blocks: int | None = None,
                             admission=None) -> InProcFleet:
    from tokenyard.services.admission.core import AdmissionConfig
    from tokenyard.services.admission.shell import AdmissionShell
    from tokenyard.services.macro_instance.core import MacroConfig
    from tokenyard.services.macro_instance.shell import MacroShell
    from tokenyard.services.priority_queue.core import QueueConfig
    from tokenyard.services.priority_queue.policies.fcfs import FCFS
    from tokenyard.services.priority_queue.shell import QueueShell
    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.shell import RouterShell
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile as get_profile
    from tokenyard.shared import config
    from tokenyard.shared.tokenizer import ByteTokenizer

    nc = await natsutil.connect(url, "test-client")
    await natsutil.ensure_queue_stream(nc)
    # A fresh fleet starts from an empty queue: purge what an earlier test left.
    await nc.jetstream().purge_stream("LLM_QUEUE")
    fleet = InProcFleet(url, nc)
    tok = ByteTokenizer()
    for i in range(workers):
        engine = SimEngine(SimEngineCore(get_profile(profile), 16, num_blocks), speed=speed)
        fleet.workers.append(await fleet.add(WorkerShell(WorkerConfig(f"tw{i}", config.DEFAULT_MODEL), engine, tok)))
    admission = AdmissionShell(admission or AdmissionConfig(), tok)
    router = RouterShell(RouterConfig(policy=policy))
    queue = QueueShell(QueueConfig(), FCFS())
    macro = MacroShell(MacroConfig(size=2))
    for shell in (admission, router, queue, macro):
        await fleet.add(shell)
    ids = {f"tw{i}" for i in range(workers)}
    # Ready when every service that reads heartbeats has had one from every worker.
    await until(lambda: ids <= set(admission.core.fleet.workers) and ids <= set(router.core.view.ids)
                and ids <= set(queue.core.workers) and ids <= set(macro.core.reported))
    return fleet


async def until(condition, timeout_s: float = 10.0, poll_s: float = 0.005, what: str = ""):
    """Await a state of the services (checked as the event loop turns), not a guessed delay.
    `condition` may be a coroutine function (a NATS request, a scrape); the first truthy value
    it gives is returned. TimeoutError after `timeout_s`, naming `what` it waited for."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                value = condition()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(poll_s)
    except TimeoutError:
        raise TimeoutError(f"timed out after {timeout_s} s waiting for {what or condition}") from None


@pytest.fixture
async def fleet(nats_server):
    f = await start_inproc_fleet(nats_server.url)
    yield f
    await f.stop()
    await f.nats.drain()


async def start_macro_fleet(url: str, workers: tuple[str, ...], macro) -> InProcFleet:
    """As start_inproc_fleet, with `workers` under one macro-instance controller run as the MacroConfig `macro`
    says (EcoServe, spatial P/D), planning every 50 ms; router least-loaded, queue FCFS."""
    from tokenyard.services.admission.core import AdmissionConfig
    from tokenyard.services.admission.shell import AdmissionShell
    from tokenyard.services.macro_instance.shell import MacroShell
    from tokenyard.services.priority_queue.core import QueueConfig
    from tokenyard.services.priority_queue.policies.fcfs import FCFS
    from tokenyard.services.priority_queue.shell import QueueShell
    from tokenyard.services.router.core import RouterConfig
    from tokenyard.services.router.shell import RouterShell
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.shared import config, natsutil
    from tokenyard.shared.tokenizer import ByteTokenizer

    nc = await natsutil.connect(url, "test-client")
    await natsutil.ensure_queue_stream(nc)
    await nc.jetstream().purge_stream("LLM_QUEUE")
    fleet = InProcFleet(url, nc)
    tok = ByteTokenizer()
    for wid in workers:
        engine = SimEngine(SimEngineCore(profile("a100-llama3-8b"), 16), speed=1.0)
        fleet.workers.append(await fleet.add(WorkerShell(WorkerConfig(wid, config.DEFAULT_MODEL), engine, tok)))
    await fleet.add(AdmissionShell(AdmissionConfig(), tok))
    await fleet.add(RouterShell(RouterConfig(policy="least-loaded")))
    await fleet.add(QueueShell(QueueConfig(), FCFS()))
    await fleet.add(MacroShell(macro, plan_s=0.05))
    return fleet
