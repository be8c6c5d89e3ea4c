"""The cluster simulator: a workload replayed through the live services' cores on a virtual
clock, in one process, with no NATS (Dynamo's offline replay, not Vidur's re-implementation).

    arrival ─> AdmissionCore.admit ─> QueueCore.offer ─> dispatch:
        QueueCore.expire(now) (429s), QueueCore.dispatchable(now) ─> RouterCore.route ─>
        WorkerCore.offer ─> SimEngineCore.add
    instance: step() at t ─> outputs at t + duration ─> next step at once
              KV events of the step ─> RouterCore.on_kv_events (the live worker polls every 20 ms)
    every 100 ms: heartbeats (WorkerCore.heartbeat) ─> router, queue, admission, macro controller;
              QueueCore.stats ─> admission (as llm.v1.pq.state live);
              MacroCore.plan ─> router (MacroState), workers (WorkerControl); dispatch again

What the shells do around the cores is repeated here and nothing else: the router shell's
retry with the refusing worker excluded (services.router.core.Placement, as the shell), the queue shell's back-off after an
unplaced request, the worker shell's heartbeat. Transport delays are zero. Events at equal
times run in insertion order, arrivals first: the same inputs give the same result.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field

from tokenyard.loadgen.workloads.blocks import TraceRequest
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.registry import DEFAULT_POLICY as DEFAULT_QUEUE_POLICY
from tokenyard.services.router.core import Placement, RouterConfig, RouterCore
from tokenyard.services.worker.sim.latency import profile as latency_profile
from tokenyard.shared import schemas
from tokenyard.shared.hashing import block_hash
from tokenyard.shared.schemas import GenerateRequest, KVEventBatch, Phase, PriorityClass, Rejected
from tokenyard.shared.tokenizer import ByteTokenizer
from tokenyard.simulator.events import DISPATCH, STEP_DONE, TICK, EventQueue
from tokenyard.simulator.fleet import SimInstance

MODEL = "tokenyard-sim"


@dataclass
class SimConfig:
    instances: int = 16
    profile: str = "a100-llama3-8b"
    policy: str = RouterConfig.policy
    """The router's declared default, as `tokenyard router` runs it."""
    queue_policy: str = DEFAULT_QUEUE_POLICY
    flow_control: bool = True
    """Flow control, on as live: the queue's (QueueConfig.flow_control) and the workers' refusal
    while saturated (WorkerConfig.flow_control)."""
    deadline_reject: bool = True
    """The queue rejects a request that can no longer meet its TTFT deadline (QueueConfig.expire_deadlines)."""
    slo_check: bool = True
    """Admission refuses a request whose predicted wait breaks its target (AdmissionConfig.slo_check)."""
    macro_size: int | None = None
    """None: no macro-instance controller (every worker accepts, as a plain fleet)."""
    mode: str = "nodg"
    heartbeat_s: float = 0.1
    keepalive_s: float = 0.5
    sample_s: float = 1.0
    """Batch sizes and P×BS are sampled this often (load-balance metrics, plots)."""
    slots_per_worker: int = 64
    max_model_len: int = 131_072
    """Llama-3.1-8B's context: Mooncake prompts reach 126k tokens."""
    seed: int = 0
    """The router's RNG seed (a softmax picker draws from it)."""
    router_options: dict = field(default_factory=dict)
    """Extra RouterConfig fields (policy knobs), passed as they are."""
    macro_options: dict = field(default_factory=dict)
    """Extra MacroConfig fields (EcoServe's `rolling` rules and SLOs, `scaling`), as they are."""


@dataclass
class ReqState:
    item: TraceRequest
    tokens: array = field(default_factory=lambda: array("d"))
    """Virtual time of every output token."""
    cached_tokens: int = 0
    worker: str = ""
    error: str | None = None
    finished: bool = False
    expired: bool = False
    """Admitted, then rejected by the queue once its TTFT deadline passed."""


class ChainCache:
    """Block ids → the engine's chain hashes (shared.hashing.ids_chain), memoised per
    (parent hash, id): a trace's shared prefixes are hashed once."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int | None, int], int] = {}

    def chain(self, ids: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        parent: int | None = None
        memo = self._memo
        for bid in ids:
            key = (parent, bid)
            h = memo.get(key)
            if h is None:
                h = memo[key] = block_hash(parent, (bid,))
            out.append(h)
            parent = h
        return out


class ClusterSim:
    def __init__(self, cfg: SimConfig, block_size: int, chains: ChainCache | None = None):
        from tokenyard.services.priority_queue.cli import make_policy

        self.cfg = cfg
        self.block_size = block_size
        self.prof = latency_profile(cfg.profile)
        num_blocks = self.prof.num_gpu_blocks * 16 // block_size  # the profile counts 16-token blocks
        self.admission = AdmissionCore(
            AdmissionConfig(
                models=[MODEL],
                max_model_len=cfg.max_model_len,
                block_size=block_size,
                default_ceiling=PriorityClass.P0,  # the simulated tenant may declare any class
                slo_check=cfg.slo_check,
            ),
            ByteTokenizer(),
        )
        self.queue = QueueCore(
            QueueConfig(flow_control=cfg.flow_control, expire_deadlines=cfg.deadline_reject,
                        slots_per_worker=cfg.slots_per_worker),
            make_policy(cfg.queue_policy),
        )
        self.router = RouterCore(RouterConfig(policy=cfg.policy, seed=cfg.seed, **cfg.router_options))
        self.macro = (
            MacroCore(MacroConfig(size=cfg.macro_size, mode=cfg.mode, **cfg.macro_options)) if cfg.macro_size else None
        )
        width = len(str(max(cfg.instances - 1, 0)))
        self.instances = [
            SimInstance(f"w{i:0{width}d}", MODEL, self.prof, block_size, num_blocks, cfg.flow_control)
            for i in range(cfg.instances)
        ]
        self.by_id = {inst.id: inst for inst in self.instances}
        self.chains = chains or ChainCache()
        self.events = EventQueue()
        self.reqs: dict[str, ReqState] = {}
        self.pbs_var: list[float] = []
        self.sample_times: list[float] = []
        self.now = 0.0
        self.wall_s = 0.0
        self._dispatch_at = float("-inf")
        """Time of the latest DISPATCH event queued (the queue's back-off end)."""
        self._on_kv = getattr(self.router, "on_kv_events", None)

    # ── the loop ──
    def run(self, items: list[TraceRequest]) -> None:
        wall0 = time.perf_counter()
        ev = self.events
        k, n = 0, len(items)
        self._tick(0.0)
        while k < n or len(ev):
            if k < n and items[k].arrival_s <= ev.peek_t():
                t = items[k].arrival_s
                self.now = t
                self._arrive(items[k], t)
                k += 1
                continue
            t, kind, data = ev.pop()
            self.now = t
            if kind == STEP_DONE:
                self._step_done(data, t)
            elif kind == TICK:
                self._tick(t, more=k < n)
            elif kind == DISPATCH:
                self._dispatch(t)
        self.wall_s = time.perf_counter() - wall0

    def _arrive(self, item: TraceRequest, now: float) -> None:
        rid = f"r{item.index}"
        st = self.reqs[rid] = ReqState(item)
        full = item.prompt_len // self.block_size
        req = GenerateRequest(
            model=MODEL,
            block_hashes=self.chains.chain(item.block_ids[:full]),
            prompt_len=item.prompt_len,
            max_tokens=item.max_tokens,
            ignore_eos=True,
            request_id=rid,
        )
        verdict = self.admission.admit(
            req, reply_to="sim", json=False, headers={"x-request-tier": f"P{item.priority}"}, now=now, new_id=rid
        )
        if isinstance(verdict, Rejected):
            st.error = f"status_{verdict.status}"
            return
        self.queue.offer(verdict, now)
        self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        for req, rejected in self.queue.expire(now):
            st = self.reqs[req.request_id]
            st.error = f"status_{rejected.status}"
            st.expired = True
        for req in self.queue.dispatchable(now):
            self._place(req, now)

    def _place(self, req: schemas.AdmittedRequest, now: float) -> None:
        placement = Placement(self.router, req)
        while (choice := placement.next(now)) is not None:
            inst = self.by_id[choice.worker_id]
            reply, start = inst.worker.offer(req, inst.engine.stats())
            if reply.accepted:
                self.queue.on_routed(req.request_id, inst.id, now)
                if start:
                    self._start(inst, req, now)
                return
            placement.refused(inst.id, reply.reason)
        self.queue.on_not_routed(req.request_id, now)
        if self.queue.paused_until > self._dispatch_at:  # one retry event per back-off, not one per request
            self._dispatch_at = self.queue.paused_until
            self.events.push(self._dispatch_at, DISPATCH)

    def _start(self, inst: SimInstance, req: schemas.AdmittedRequest, now: float) -> None:
        st = self.reqs[req.request_id]
        st.worker = inst.id
        try:
            inst.engine.add(req)
        except ValueError:  # larger than the engine's whole KV cache: the live worker errors too
            inst.worker.streams.pop(req.request_id, None)
            st.error = "engine_refused"
            return
        inst.dirty = True
        if not inst.busy:
            self._step(inst, now)

    def _step(self, inst: SimInstance, now: float) -> None:
        res = inst.engine.step()
        if res.duration_s <= 0.0 and not res.outputs:
            inst.busy = False  # nothing could be scheduled; the next tick tries again
            return
        inst.busy = True
        inst.dirty = True
        inst.pending = res
        inst.busy_s += res.duration_s
        inst.steps += 1
        self.events.push(now + res.duration_s, STEP_DONE, inst)

    def _step_done(self, inst: SimInstance, now: float) -> None:
        res, inst.pending = inst.pending, None
        reqs = self.reqs
        streams = inst.worker.streams
        for out in res.outputs:
            st = reqs[out.request_id]
            if out.new_token_ids:
                st.tokens.append(now)
            if out.finish_reason == "deadline":  # rejected by the engine (SCORPIO), never started
                st.error, st.expired = "status_429", True
                del streams[out.request_id]
                continue
            if out.finished:
                st.finished = True
                st.cached_tokens = out.num_cached_tokens
                # No client stream here: WorkerCore.on_output's chunk numbering and text
                # decoding are transport, skipped (a quarter of the run time); the finished
                # request leaves the worker's stream table as on_output would make it.
                del streams[out.request_id]
        if self._on_kv is not None:
            events = inst.engine.pool.drain_events()
            if events:
                self._on_kv(inst.id, KVEventBatch(ts=now, events=events), now)
        else:
            inst.engine.pool.events.clear()
        if inst.engine.has_work():
            self._step(inst, now)
        else:
            inst.busy = False

    def _tick(self, now: float, more: bool = True) -> None:
        cfg = self.cfg
        for inst in self.instances:
            if inst.dirty or now - inst.last_hb_s >= cfg.keepalive_s:
                hb = inst.worker.heartbeat(inst.engine.stats(), now)
                self.router.on_heartbeat(hb, now)
                self.queue.on_heartbeat(hb, now)
                self.admission.on_heartbeat(hb, now)
                if self.macro is not None:
                    self.macro.on_heartbeat(hb, now)
                inst.last_hb_s = now
                inst.dirty = inst.busy
        if self.macro is not None:
            plan = self.macro.plan(now)
            for state in plan.states:
                self.router.on_macro_state(state)
            for ctl in plan.controls:
                target = self.by_id.get(ctl.worker_id)
                if target is not None:
                    target.worker.on_control(ctl)
                    target.dirty = True
            for inst in self.instances:  # EcoServe: the engine runs the phase its worker says
                if inst.worker.phase != Phase.MIXED:  # (as WorkerShell._sync_phase does live)
                    phase = inst.worker.engine_phase(inst.engine.stats())
                    if phase != inst.engine.phase:
                        inst.engine.set_phase(phase)
                        inst.dirty = True
        if not self.sample_times or now - self.sample_times[-1] >= cfg.sample_s - 1e-9:
            self._sample(now)
        for inst in self.instances:  # an engine that could not schedule anything retries here
            if inst.engine.expire(now):  # SCORPIO's rejection path (a no-op for other policies)
                inst.dirty = True
            if not inst.busy and inst.engine.has_work():
                self._step(inst, now)
        self._dispatch(now)
        self.admission.on_queue_stats(self.queue.stats("sim-queue", now), now)  # live: every 100 ms
        if more or len(self.queue) or any(inst.busy or inst.engine.has_work() for inst in self.instances):
            self.events.push(now + cfg.heartbeat_s, TICK)

    def _sample(self, now: float) -> None:
        self.sample_times.append(now)
        products = []
        for inst in self.instances:
            s = inst.engine.stats()
            inst.bs_samples.append(min(s.running, 65535))
            products.append(float(s.queued_prefill_tokens) * s.running)
        mean = sum(products) / len(products)
        self.pbs_var.append(sum((p - mean) ** 2 for p in products) / len(products))
