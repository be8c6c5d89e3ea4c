"""The macro-instance controller's shell: heartbeats and the priority queue's states
(`llm.v1.pq.state`, mitosis's backlog signal) in; every `plan_s` ask the core for a
plan, publish changed states on `llm.v1.macro.<id>.state`, write them to the JetStream KV
bucket `tokenyard_topology` (key `macro.<id>`), send WorkerControl to workers whose
phase or group must change, and hand mitosis scaling's ProvisionOps to the Provisioner. All states are re-published every `republish_s`, so a router
that starts late learns the topology without reading the bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.request import Request
from nats.micro.service import Service
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.macro_instance.provisioner import NoProvisioner, Provisioner
from tokenyard.shared import codec, natsutil, schemas, subjects, telemetry
from tokenyard.shared.metrics import MacroMetrics
from tokenyard.shared.service import new_instance_id

log = telemetry.logger("macro")

TOPOLOGY = f"{subjects.PREFIX}.macro.topology"


class MacroShell:
    kind = "macro"

    def __init__(self, cfg: MacroConfig, plan_s: float = 0.25, republish_s: float = 2.0,
                 provisioner: Provisioner | None = None):
        self.core = MacroCore(cfg)
        self.provisioner = provisioner or NoProvisioner()
        self.instance_id = new_instance_id(self.kind)
        self.plan_s = plan_s
        self.republish_s = republish_s
        self._task: asyncio.Task | None = None
        self.metrics = MacroMetrics()

    async def start(self, nc: Client, service: Service) -> None:
        self.nc = nc
        self.kv = await natsutil.topology_bucket(nc)
        await nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        await nc.subscribe(subjects.QUEUE_STATE, cb=self._on_queue_state)
        await service.add_endpoint(name="topology", subject=TOPOLOGY, handler=self._on_topology)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        close = getattr(self.provisioner, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    async def _on_heartbeat(self, msg: Msg) -> None:
        with contextlib.suppress(codec.DecodeError):
            self.core.on_heartbeat(codec.decode(msg.data, schemas.Heartbeat), time.time())

    async def _on_queue_state(self, msg: Msg) -> None:
        with contextlib.suppress(codec.DecodeError):
            self.core.on_queue_stats(codec.decode(msg.data, schemas.QueueStats), time.time())

    async def _loop(self) -> None:
        last_full = 0.0
        while True:
            await asyncio.sleep(self.plan_s)
            now = time.time()
            try:
                plan = self.core.plan(now)
                self.metrics.observe_states(plan.states)
                for state in plan.states:
                    await self._publish(state)
                    log.info("macro_state", macro=state.macro_id, workers=state.workers, epoch=state.epoch)
                for ctl in plan.controls:
                    await self.nc.publish(subjects.worker_control(ctl.worker_id), codec.encode(ctl))
                for d in plan.scaled:
                    log.info("mitosis", decision=d.kind, macro=d.macro_id, workers=list(d.workers), into=d.into,
                             backlog_share=round(self.core.backlog_share, 3))
                for op in plan.provision:
                    log.info("scale", op=op.kind, macro=op.macro_id, worker=op.worker_id)
                    if op.kind == "add":
                        self.provisioner.add(op.macro_id)
                    else:
                        self.provisioner.remove(op.worker_id)
                if now - last_full >= self.republish_s:
                    last_full = now
                    for state in self.core.states.values():
                        await self.nc.publish(subjects.macro_state(state.macro_id), codec.encode(state))
            except Exception as e:
                log.warning("plan_failed", error=repr(e))

    async def _publish(self, state: schemas.MacroState) -> None:
        await self.nc.publish(subjects.macro_state(state.macro_id), codec.encode(state))
        if state.workers:
            await self.kv.put(f"macro.{state.macro_id}", codec.encode(state, json=True))
        else:
            with contextlib.suppress(Exception):
                await self.kv.delete(f"macro.{state.macro_id}")

    async def _on_topology(self, req: Request) -> None:
        await req.respond(msgspec.json.encode(list(self.core.states.values())))
