"""Live EcoServe over a real nats-server: a 3-worker macro-instance rotates its prefill phase
(the controller's MacroStates on `llm.v1.macro.<id>.state`, its WorkerControls on
`llm.v1.worker.<id>.control`), and requests land only on the worker in its prefill phase."""

from __future__ import annotations

import asyncio
import time

import pytest
from tokenyard.services.macro_instance.core import MacroConfig
from tokenyard.services.macro_instance.rolling import RollingConfig
from tokenyard.services.macro_instance.shell import MacroShell
from tokenyard.shared import codec, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import InProcFleet, start_macro_fleet, until

WORKERS = ("ew0", "ew1", "ew2")
PHASE_S = 0.3


async def start_ecoserve_fleet(url: str) -> InProcFleet:
    """3 workers under one EcoServe macro-instance, phases of PHASE_S."""
    rolling = RollingConfig(min_phase_s=PHASE_S, stagger_s=PHASE_S)
    return await start_macro_fleet(url, WORKERS, MacroConfig(size=3, mode="ecoserve", rolling=rolling))


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_prefill_phase_rotates_and_requests_land_only_on_the_prefill_worker(nats_server):
    fleet = await start_ecoserve_fleet(nats_server.url)
    states: list[schemas.MacroState] = []
    rotated = asyncio.Event()

    async def on_state(msg) -> None:
        s = codec.decode(msg.data, schemas.MacroState)
        if set(s.workers) != set(WORKERS):
            return
        states.append(s)
        if {w for x in states for w in x.accepting} == set(WORKERS):
            rotated.set()

    await fleet.nats.subscribe(subjects.MACRO_STATE_ALL, cb=on_state)
    # Every offer a worker gets, with the phase it was in: the worker's own record.
    offers: list[tuple[str, str, str, bool]] = []
    for host in fleet.workers:
        core = host.shell.core

        def offer(req, stats, prefill=None, *, core=core, inner=core.offer):
            reply, start = inner(req, stats, prefill)
            offers.append((req.request_id, core.cfg.worker_id, str(core.phase), reply.accepted))
            return reply, start

        core.offer = offer
    try:
        async with asyncio.timeout(30):
            await rotated.wait()  # the phase has been on each of the three workers
        client = TokenyardClient(fleet.nats)
        served: dict[str, str] = {}
        async with asyncio.timeout(60):
            while set(served.values()) != set(WORKERS):
                done = await client.generate(schemas.GenerateRequest(prompt="x" * 300, max_tokens=8))
                assert done.finish_reason == "length", done
                served[done.request_id] = done.worker_id
        accepted = [(rid, w, phase) for rid, w, phase, ok in offers if ok]
        assert sorted(rid for rid, _, _ in accepted) == sorted(served)
        assert all(phase == "prefill" for _, _, phase in accepted), accepted
        assert {rid: w for rid, w, _ in accepted} == served
        refused = [(w, phase) for _, w, phase, ok in offers if not ok]
        assert all(phase == "decode" for _, phase in refused)  # only a phase switch in flight is refused
        # the published plan: exactly one worker accepting at a time on an idle group, in rotation
        assert all(len(s.accepting) == 1 and s.phases[s.accepting[0]] == "prefill" for s in states)
        order = [s.accepting[0] for s in states]
        changes = [b for a, b in zip(order, order[1:], strict=False) if a != b]
        nxt = {"ew0": "ew1", "ew1": "ew2", "ew2": "ew0"}
        assert all(nxt[a] == b for a, b in zip([order[0], *changes], changes, strict=False))
    finally:
        await fleet.stop()
        await fleet.nats.drain()


async def test_local_provisioner_starts_a_worker_that_heartbeats_and_stops_it(nats_server):
    from tokenyard.services.macro_instance.provisioner import LocalProcessProvisioner
    from tokenyard.shared import natsutil

    nc = await natsutil.connect(nats_server.url, "test-provisioner")
    beat = asyncio.Event()

    async def on_beat(msg) -> None:
        beat.set()

    sub = await nc.subscribe(subjects.heartbeat("ptest0"), cb=on_beat)
    prov = LocalProcessProvisioner(nats_server.url, profile="zero", id_prefix="ptest")
    try:
        prov.add("m0")
        proc = prov.procs["ptest0"]
        async with asyncio.timeout(60):
            await beat.wait()
        prov.remove("ptest0")
        assert "ptest0" not in prov.procs
        assert await asyncio.to_thread(proc.wait, 30) == 0  # SIGTERM: it drains and exits cleanly
    finally:
        prov.close()
        await sub.unsubscribe()
        await nc.drain()


class RecordingProvisioner:
    def __init__(self) -> None:
        self.ops: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def add(self, macro_id: str) -> None:
        self.ops.append(("add", macro_id))
        self.changed.set()

    def remove(self, worker_id: str) -> None:
        self.ops.append(("remove", worker_id))
        self.changed.set()


async def test_mitosis_shrink_drains_a_live_worker_and_asks_the_provisioner_to_stop_it(nats_server):
    from tokenyard.services.macro_instance.mitosis import MitosisConfig
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.shared import config, natsutil
    from tokenyard.shared.tokenizer import ByteTokenizer

    nc = await natsutil.connect(nats_server.url, "test-mitosis")
    fleet = InProcFleet(nats_server.url, nc)
    for wid in ("sw0", "sw1"):
        engine = SimEngine(SimEngineCore(profile("zero"), 16))
        fleet.workers.append(await fleet.add(WorkerShell(WorkerConfig(wid, config.DEFAULT_MODEL), engine,
                                                         ByteTokenizer())))
    prov = RecordingProvisioner()
    scaling = MitosisConfig(n_lower=1, n_upper=2, shrink_window_s=0.3, grow_window_s=60.0, min_workers=1)
    macro = MacroShell(MacroConfig(size=2, scaling=scaling), plan_s=0.05, provisioner=prov)
    await fleet.add(macro)
    try:
        async with asyncio.timeout(30):
            await prov.changed.wait()  # idle workers: utilisation 0 < 40% for the shrink window
            assert prov.ops == [("remove", "sw1")]
            await until(lambda: fleet.workers[1].shell.core.draining, timeout_s=30)  # its drain control arrives
        assert not fleet.workers[0].shell.core.draining

        # min_workers = 1: no further shrink, checked once the remaining group's utilisation
        # history (restarted by the shrink) has spanned two more shrink windows of idle samples.
        def spanned_twice() -> bool:
            h = macro.core.mitosis.hist.get(next(iter(macro.core.groups), ""))
            return h is not None and h.mean_over(time.time(), 2 * scaling.shrink_window_s) is not None

        await until(spanned_twice)
        assert prov.ops == [("remove", "sw1")]
    finally:
        await fleet.stop()
        await nc.drain()


async def test_mitosis_grows_on_the_queue_state_it_reads_over_nats(nats_server):
    """Idle workers (utilisation 0, no SLO miss) and a queue state, published as the queue
    publishes it, whose line is 8 s long against the 2 s TTFT SLO: the controller, connected as
    the `macro` user, reads it on `llm.v1.pq.state` and asks for one worker more."""
    from tokenyard.services.macro_instance.mitosis import MitosisConfig
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.services.worker.sim.core import SimEngineCore
    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.shared import config, natsutil
    from tokenyard.shared.tokenizer import ByteTokenizer

    nc = await natsutil.connect(nats_server.url, "test-mitosis-queue")
    queue_nc = await natsutil.connect(nats_server.url, "test-as-queue", kind="queue")
    fleet = InProcFleet(nats_server.url, nc)
    for wid in ("qw0", "qw1"):
        engine = SimEngine(SimEngineCore(profile("zero"), 16))
        fleet.workers.append(await fleet.add(WorkerShell(WorkerConfig(wid, config.DEFAULT_MODEL), engine,
                                                         ByteTokenizer())))
    prov = RecordingProvisioner()
    scaling = MitosisConfig(n_lower=1, n_upper=4, grow_window_s=0.3, shrink_window_s=600.0)
    macro = MacroShell(MacroConfig(size=4, scaling=scaling), plan_s=0.05, provisioner=prov)
    await fleet.add(macro)
    backlog = schemas.QueueStats(instance_id="pq-live", ts=0.0, policy="fcfs", depth=[0, 40, 0, 0],
                                 work_tokens=[0, 80_000, 0, 0], in_flight=10, drain_tokens_per_s=10_000.0)
    try:
        async with asyncio.timeout(30):
            while not prov.ops:  # the queue publishes its state every 100 ms
                await queue_nc.publish(subjects.QUEUE_STATE, codec.encode(backlog))
                await asyncio.sleep(0.1)
        assert prov.ops == [("add", "m0")]
        assert macro.core.backlog_share == pytest.approx(40 * (1 - 10_000 * 2.0 / 80_000) / 50)
        assert all(macro.core.load(w).compute_util == 0.0 for w in ("qw0", "qw1"))
    finally:
        await fleet.stop()
        await queue_nc.drain()
        await nc.drain()
