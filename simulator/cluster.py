"""The cluster simulator: a workload replayed through the live services' cores on a virtual
clock, in one process, with no NATS (Dynamo's offline replay, not Vidur's re-implementation).

    arrival ─> AdmissionCore.admit ─> QueueCore.offer ─> dispatch:
        QueueCore.expire(now) (429s), QueueCore.dispatchable(now) ─> RouterCore.route ─>
        WorkerCore.offer ─> SimEngineCore.add
    instance: step() at t ─> outputs at t + duration ─> next step at once
              KV events of the step ─> RouterCore.on_kv_events (the live worker polls every 20 ms)
              between two events that look at an engine (arrival, dispatch, tick), its pure
              decode steps run as one fold (fold.py): the same times, fewer events
    every 100 ms: heartbeats (WorkerCore.heartbeat) ─> router, queue, admission, macro controller;
              QueueCore.stats ─> admission, macro controller (as llm.v1.pq.state live);
              MacroCore.plan ─> router (MacroState), workers (WorkerControl); dispatch again
    spatial P/D (mode pd): a prefill worker's engine hands a request off after its first
              token ─> KV_ARRIVE at + prompt KV bytes / inter-node bandwidth ─> RouterCore
              (decode leg, services.router.pd) ─> decode worker: SimEngineCore.add_prefilled

Folding is exact because only these events look at an engine or at what its steps deliver
(streams, KV events, token times): an arrival or a DISPATCH (an offer reads its stats, a
placement adds a request), a TICK (heartbeats, samples, phases, expiry) and a KV_ARRIVE. A
fold started at a STEP_DONE covers only steps that end before the next of them
(EventQueue.next_look_t, the next arrival), so each sees the engine, the worker's streams
and the router's index as step by step; the step that straddles it ends the fold where the
fold delivers nothing before it (no finish, no evicted block), else it runs alone.
Other engines' steps in between touch only the router's index, per worker (order-free).
Spatial P/D is not folded: a prefill worker's step can queue a KV_ARRIVE inside a fold.

What the shells do around the cores is repeated here and nothing else: the router shell's
retry with the refusing worker excluded (services.router.core.Placement, as the shell), the queue shell's back-off after an
unplaced request, the worker shell's heartbeat. Transport delays are zero. Events at equal
times run in insertion order, arrivals first: the same inputs give the same result.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field, replace

import msgspec
from tokenyard.loadgen.workloads.blocks import TraceRequest
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.macro_instance.mitosis import mitosis_config
from tokenyard.services.macro_instance.rolling import RollingConfig
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.registry import DEFAULT_POLICY as DEFAULT_QUEUE_POLICY
from tokenyard.services.router.core import Placement, RouterConfig, RouterCore
from tokenyard.services.worker.sim.latency import profile as latency_profile
from tokenyard.shared import schemas
from tokenyard.shared.ecoserve import EcoConfig
from tokenyard.shared.hashing import block_hash
from tokenyard.shared.schemas import GenerateRequest, KVEventBatch, Phase, PriorityClass, Rejected
from tokenyard.shared.tokenizer import ByteTokenizer
from tokenyard.simulator.events import DISPATCH, KV_ARRIVE, PROVISION, STEP_DONE, TICK, EventQueue
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
    """Extra MacroConfig fields (EcoServe's `rolling` rules, `scaling`), as they are; the
    rolling rules' SLOs are replaced by the two below."""
    chunked_prefill: bool = True
    """False: every engine runs vLLM without chunked prefill (whole prompts, or decodes)."""
    prefill_only_phases: bool = False
    """EcoServe: a worker's prefill phase prefills only (seed 002 §2.2.1), instead of mixing
    its decodes into the chunks."""
    pd_prefill: int | None = None
    """Mode `pd`: prefill workers per macro-instance (MacroConfig.pd_prefill)."""
    mitosis: bool = False
    """Mitosis scaling acted on: the controller grows, splits, shrinks and merges the
    macro-instances (seed's windows and thresholds, N_upper = the macro size, N_lower = half
    of it) and the simulator starts and stops workers as it says."""
    provision_delay_s: float = 30.0
    """Mitosis: a worker the controller asks for heartbeats this long after (the vLLM
    worker's engine takes 20–50 s to start before it registers)."""
    fold_decodes: bool = True
    """Fold each engine's pure decode steps between the events that look at it (fold.py): the
    same results, fewer events. False: every step one by one (the reference it is tested against)."""
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    """The SLOs the fleet runs to: EcoServe's constraint check and phase rules, and every
    engine's saved-slack clock. None: EcoConfig's defaults. `simulate` fills them from the
    goodput SLOs, so a run is held to the SLOs it is scored against (issue 13, fixes 1–2)."""

    def slos(self) -> tuple[float, float]:
        """(TTFT, TPOT) SLOs in ms, defaults filled in."""
        eco = EcoConfig()
        return (
            eco.ttft_slo_ms if self.ttft_slo_ms is None else self.ttft_slo_ms,
            eco.tpot_slo_ms if self.tpot_slo_ms is None else self.tpot_slo_ms,
        )


def with_slos(cfg: SimConfig, goodput_ms: dict[str, float] | None) -> SimConfig:
    """`cfg` with the goodput's TTFT/TPOT SLOs where `cfg` sets none."""
    g = goodput_ms or {}
    return replace(
        cfg,
        ttft_slo_ms=cfg.ttft_slo_ms if cfg.ttft_slo_ms is not None else g.get("ttft"),
        tpot_slo_ms=cfg.tpot_slo_ms if cfg.tpot_slo_ms is not None else g.get("tpot"),
    )


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
    ttft_budget_s: float = 0.0
    """Its TTFT deadline less its arrival, as admission stamped it (shared.slo.ttft_deadline_s:
    class target + own predicted prefill); 0: none (P3) or not admitted."""


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
        ttft_ms, tpot_ms = cfg.slos()
        self.macro = None
        if cfg.macro_size:
            opts = dict(cfg.macro_options)
            rolling = opts.pop("rolling", None) or RollingConfig()
            rolling = replace(rolling, eco=replace(rolling.eco, ttft_slo_ms=ttft_ms, tpot_slo_ms=tpot_ms))
            if cfg.mode == "pd":
                opts.setdefault("pd_prefill", cfg.pd_prefill)
            if cfg.mitosis and "scaling" not in opts:
                opts["scaling"] = mitosis_config(cfg.macro_size)
            self.macro = MacroCore(MacroConfig(size=cfg.macro_size, mode=cfg.mode, rolling=rolling, **opts))
        elif cfg.mode != "nodg":
            raise ValueError(f"mode '{cfg.mode}' needs macro-instances (a macro size)")
        width = len(str(max(cfg.instances - 1, 0)))
        self.instances = [
            SimInstance(
                f"w{i:0{width}d}", MODEL, self.prof, block_size, num_blocks, tpot_ms, cfg.flow_control,
                chunked_prefill=cfg.chunked_prefill, prefill_only_phase=cfg.prefill_only_phases,
                max_model_len=cfg.max_model_len,
            )
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
        self._fold = cfg.fold_decodes and cfg.mode != "pd"
        """Fold engines' decode steps (fold.py) between the events that look at them. Not in
        spatial P/D, where any prefill worker's step may send a KV_ARRIVE sooner than that."""
        self._next_arrival = float("inf")
        """The next arrival's time (the loop keeps it: a fold ends before it)."""
        self._engine_options = dict(
            chunked_prefill=cfg.chunked_prefill, prefill_only_phase=cfg.prefill_only_phases,
            max_model_len=cfg.max_model_len,
        )
        self._num_blocks, self._tpot_ms, self._width = num_blocks, tpot_ms, width
        self.retiring: set[str] = set()
        """Mitosis: workers told to go; each stops once its last request is done."""
        self.stopped: set[str] = set()
        self.scaling_log: list[tuple[float, str, str, str]] = []
        """Mitosis: (time, add | remove | started | stopped, macro id, worker id) for workers;
        (time, grow | split | shrink | merge, macro id, the macro-instance a split made or a
        merge joined) for the controller's decisions."""
        self.fleet_samples: list[tuple[float, int, int, float]] = []
        """(time, workers running, macro-instances, the controller's queue-backlog share) at
        every sample tick."""
        self.legs: list[schemas.AdmittedRequest] = []
        """Spatial P/D decode legs whose KV has landed but no decode worker took yet."""
        self.handoffs = 0
        self.step_events = 0
        """Engine results the loop handled (STEP_DONE events; a fold counts once)."""

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
            self._next_arrival = items[k].arrival_s if k < n else float("inf")
            t, kind, data = ev.pop()
            self.now = t
            if kind == STEP_DONE:
                self._step_done(data, t)
            elif kind == TICK:
                self._tick(t, more=k < n)
            elif kind == DISPATCH:
                self._dispatch(t)
            elif kind == KV_ARRIVE:
                self._place_leg(data, t)
            elif kind == PROVISION:
                self._provisioned(data, t)
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
        st.ttft_budget_s = verdict.deadline_s - now if verdict.deadline_s > 0 else 0.0
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

    def _place_leg(self, req: schemas.AdmittedRequest, now: float) -> bool:
        """A P/D decode leg (its KV sent): to a decode worker, as the router places it; kept
        for the next tick if none takes it."""
        placement = Placement(self.router, req)
        while (choice := placement.next(now)) is not None:
            inst = self.by_id[choice.worker_id]
            reply, start = inst.worker.offer(req, inst.engine.stats())
            if reply.accepted:
                if start:
                    self._start(inst, req, now)
                return True
            placement.refused(inst.id, reply.reason)
        self.legs.append(req)
        return False

    def _hand_off(self, inst: SimInstance, now: float) -> None:
        """Requests the P/D prefill worker finished prefilling: their KV goes out over the
        inter-node link; each lands as a decode leg after its transfer time."""
        for req, cached in inst.engine.handed_off:
            inst.worker.streams.pop(req.request_id, None)
            self.reqs[req.request_id].cached_tokens = cached
            leg = msgspec.structs.replace(req, kv_from=inst.id)
            self.events.push(now + self.prof.network_s(req.prompt_len), KV_ARRIVE, leg)
            self.handoffs += 1
        inst.engine.handed_off.clear()

    def _start(self, inst: SimInstance, req: schemas.AdmittedRequest, now: float) -> None:
        st = self.reqs[req.request_id]
        st.worker = inst.id
        try:
            if req.kv_from:
                inst.engine.add_prefilled(req, st.cached_tokens)
            else:
                inst.engine.add(req)
        except ValueError:  # larger than the engine's whole KV cache: the live worker errors too
            inst.worker.streams.pop(req.request_id, None)
            st.error = "engine_refused"
            return
        inst.dirty = True
        if not inst.busy:
            self._step(inst, now)

    def _step(self, inst: SimInstance, now: float, fold: bool = False) -> None:
        """Start the engine's next step at `now`. With `fold` (from its own STEP_DONE, where
        nothing else looks at it before the next event that is not a step): its pure decode
        steps up to that event as one (fold.py), with the same times, tokens and blocks."""
        res = None
        if fold and self._fold:
            until = min(self._next_arrival, self.events.next_look_t())
            res = inst.engine.fold(now, until, straddle=True)
        if res is None:
            res = inst.engine.step()
            if res.duration_s <= 0.0 and not res.outputs:
                inst.busy = False  # nothing could be scheduled; the next tick tries again
                return
            inst.busy_s += res.duration_s
            end = now + res.duration_s
        else:
            times, end, busy_s = [], now, inst.busy_s
            for d in res.step_durations:  # the clock and the busy time, added step by step
                end += d
                busy_s += d
                times.append(end)
            inst.busy_s = busy_s
            inst.fold_times = times
        inst.busy = True
        inst.dirty = True
        inst.pending = res
        inst.steps += res.num_steps
        self.step_events += 1
        self.events.push(end, STEP_DONE, inst)

    def _step_done(self, inst: SimInstance, now: float) -> None:
        res, inst.pending = inst.pending, None
        reqs = self.reqs
        streams = inst.worker.streams
        folded = res.num_steps > 1
        if folded:  # token j of each output came at the end of the fold's step j
            times, inst.fold_times = inst.fold_times, None
        for out in res.outputs:
            st = reqs[out.request_id]
            if out.new_token_ids:
                if folded:
                    st.tokens.extend(times[: len(out.new_token_ids)])
                else:
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
        if inst.engine.handed_off:
            self._hand_off(inst, now)
        if self._on_kv is not None:
            events = inst.engine.pool.drain_events()
            if events:
                self._on_kv(inst.id, KVEventBatch(ts=now, events=events), now)
        else:
            inst.engine.pool.events.clear()
        if inst.engine.has_work():
            self._step(inst, now, fold=True)
        else:
            inst.busy = False

    def _provision(self, plan_ops, now: float) -> None:
        """Mitosis's ProvisionOps: `add` starts a simulated worker that joins after
        `provision_delay_s`; `remove` lets the drained worker finish, then stops it."""
        for op in plan_ops:
            self.scaling_log.append((now, op.kind, op.macro_id, op.worker_id))
            if op.kind == "add":
                self.events.push(now + self.cfg.provision_delay_s, PROVISION, op.macro_id)
            elif op.kind == "remove":
                self.retiring.add(op.worker_id)

    def _provisioned(self, macro_id: str, now: float) -> None:
        wid = f"w{len(self.instances):0{self._width}d}"
        inst = SimInstance(wid, MODEL, self.prof, self.block_size, self._num_blocks, self._tpot_ms,
                           self.cfg.flow_control, **self._engine_options)
        self.instances.append(inst)
        self.by_id[wid] = inst
        self.scaling_log.append((now, "started", macro_id, wid))

    def _retire(self, now: float) -> None:
        for wid in sorted(self.retiring):
            inst = self.by_id[wid]
            if not inst.busy and not inst.engine.has_work() and not inst.worker.streams:
                self.retiring.discard(wid)
                self.stopped.add(wid)
                self.scaling_log.append((now, "stopped", "", wid))

    def _tick(self, now: float, more: bool = True) -> None:
        cfg = self.cfg
        if self.retiring:
            self._retire(now)
        stopped, keepalive = self.stopped, cfg.keepalive_s
        receivers = [self.router.on_heartbeat, self.queue.on_heartbeat, self.admission.on_heartbeat]
        if self.macro is not None:
            receivers.append(self.macro.on_heartbeat)
        for inst in self.instances:
            if inst.dirty or now - inst.last_hb_s >= keepalive:
                if stopped and inst.id in stopped:  # a stopped worker sends nothing: it falls silent
                    continue
                hb = inst.worker.heartbeat(inst.engine.stats(), now)
                for receive in receivers:
                    receive(hb, now)
                inst.last_hb_s = now
                inst.dirty = inst.busy
        if self.macro is not None:
            plan = self.macro.plan(now)
            for state in plan.states:
                self.router.on_macro_state(state)
            for d in plan.scaled:
                self.scaling_log.append((now, d.kind, d.macro_id, d.into))
            if plan.provision:
                self._provision(plan.provision, now)
            for ctl in plan.controls:
                target = self.by_id.get(ctl.worker_id)
                if target is not None:
                    target.worker.on_control(ctl)
                    target.dirty = True
            for inst in self.instances:  # EcoServe: the engine runs the phase its worker says
                inst.engine.hand_off = inst.worker.hands_off  # spatial P/D's prefill workers
                if inst.worker.phase != Phase.MIXED:  # (as WorkerShell._sync_phase does live)
                    phase = inst.worker.engine_phase(inst.engine.stats())
                    if phase != inst.engine.phase:
                        inst.engine.set_phase(phase)
                        inst.dirty = True
        if not self.sample_times or now - self.sample_times[-1] >= cfg.sample_s - 1e-9:
            self._sample(now)
        for inst in self.instances:  # an engine that could not schedule anything retries here
            engine = inst.engine
            if engine.waiting and engine.expire(now):  # SCORPIO's rejection path (others: a no-op)
                inst.dirty = True
            if not inst.busy and engine.has_work():
                self._step(inst, now)
        legs, self.legs = self.legs, []
        for leg in legs:
            self._place_leg(leg, now)
        self._dispatch(now)
        qstats = self.queue.stats("sim-queue", now)  # live: on llm.v1.pq.state every 100 ms
        self.admission.on_queue_stats(qstats, now)
        if self.macro is not None:  # mitosis's backlog signal
            self.macro.on_queue_stats(qstats, now)
        if more or len(self.queue) or self.legs or self.retiring or any(inst.busy or inst.engine.has_work() for inst in self.instances):
            self.events.push(now + cfg.heartbeat_s, TICK)

    def _sample(self, now: float) -> None:
        self.sample_times.append(now)
        groups = len(self.macro.groups) if self.macro is not None else 0
        backlog = self.macro.backlog_share if self.macro is not None else 0.0
        self.fleet_samples.append((now, len(self.instances) - len(self.stopped), groups, backlog))
        products = []
        for inst in self.instances:
            s = inst.engine.stats()
            inst.bs_samples.append(min(s.running, 65535))
            products.append(float(s.queued_prefill_tokens) * s.running)
        mean = sum(products) / len(products)
        self.pbs_var.append(sum((p - mean) ** 2 for p in products) / len(products))
