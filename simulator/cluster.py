"""The cluster simulator: a workload replayed through the live services' cores on a virtual
clock, in one process, with no NATS (Dynamo's offline replay, not Vidur's re-implementation).

    arrival ─> AdmissionCore.admit ─> QueueCore.offer ─> dispatch:
        QueueCore.expire(now) (429s), QueueCore.dispatchable(now) ─> RouterCore.route ─>
        WorkerCore.offer ─> SimEngineCore.add
    instance: step() at t ─> outputs at t + duration ─> next step at once
              KV events of the step ─> RouterCore.on_kv_events (the live worker polls every 20 ms)
              between two events that look at an engine (arrival, dispatch, tick), its pure
              decode steps run as one fold (fold.py): the same times, fewer events; across
              the ticks that read only its stats (across.py)
    every 100 ms (tick.py): heartbeats (WorkerCore.heartbeat) ─> router, queue, admission,
              macro controller, an unchanged worker's as a keep-alive; QueueCore.stats ─>
              admission, macro controller (as llm.v1.pq.state live); MacroCore.plan ─>
              router (MacroState), workers (WorkerControl); dispatch again. A silent
              tick (another follows before the next arrival, nothing to route) holds
              busy workers' heartbeats back: the next one's supersede them (tick.py)
    spatial P/D (mode pd, pd.py): a prefill worker's engine hands a request off after its
              first token ─> KV_ARRIVE at + prompt KV bytes / inter-node bandwidth ─>
              RouterCore (decode leg, services.router.pd) ─> decode worker
    mitosis (scaling.py): the controller's ProvisionOps start and stop simulated workers

This module is the loop and a request's way in (arrival, dispatch, placement, the engine's
steps); config.py the settings (SimConfig), requests.py a request's record, fleet.py an
instance, events.py the virtual clock.

Folding is exact because only these events look at an engine or at what its steps deliver
(streams, KV events, token times): an arrival or a DISPATCH (an offer reads its stats, a
placement adds a request), a TICK (heartbeats, samples, phases, expiry) and a KV_ARRIVE. A
fold started at a STEP_DONE covers only steps that end before the next of them
(EventQueue.next_look_t, the next arrival), so each sees the engine, the worker's streams
and the router's index as step by step; the step that straddles it ends the fold where the
fold delivers nothing before it (no finish, no evicted block), else it runs alone.
Other engines' steps in between touch only the router's index, per worker (order-free).
Spatial P/D is not folded: a prefill worker's step can queue a KV_ARRIVE inside a fold.
Where the queue is empty and only a TICK is queued (no macro-instance controller), a tick
reads an engine only through its stats, so the fold goes on across the ticks before the
next arrival, keeping the stats each tick sees (across.py).

What the shells do around the cores is repeated here and nothing else: the router shell's
retry with the refusing worker excluded (services.router.core.Placement, as the shell), the
queue shell's back-off after an unplaced request, the worker shell's heartbeat. Transport delays are zero. Events at equal
times run in insertion order, arrivals first: the same inputs give the same result.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import reduce
from itertools import accumulate
from operator import add

from tokenyard.loadgen.workloads.blocks import TraceRequest
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.macro_instance.mitosis import mitosis_config
from tokenyard.services.macro_instance.rolling import RollingConfig
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.router.core import Placement, RouterConfig, RouterCore
from tokenyard.services.worker.sim.latency import profile as latency_profile
from tokenyard.shared import schemas
from tokenyard.shared.schemas import GenerateRequest, KVEventBatch, PriorityClass, Rejected
from tokenyard.shared.tokenizer import ByteTokenizer
from tokenyard.simulator import scaling
from tokenyard.simulator.across import Ticks, fold_across
from tokenyard.simulator.config import MODEL, SimConfig, with_slos
from tokenyard.simulator.events import DISPATCH, KV_ARRIVE, PROVISION, STEP_DONE, TICK, EventQueue
from tokenyard.simulator.fleet import SimInstance
from tokenyard.simulator.pd import hand_off, place_leg
from tokenyard.simulator.requests import ChainCache, ReqState
from tokenyard.simulator.tick import tick

__all__ = ["MODEL", "ChainCache", "ClusterSim", "ReqState", "SimConfig", "with_slos"]
"""SimConfig, with_slos, ReqState and ChainCache live in config.py and requests.py; they are
imported from here as before the split."""


class ClusterSim:
    def __init__(self, cfg: SimConfig, block_size: int, chains: ChainCache | None = None):
        from tokenyard.services.priority_queue.cli import make_policy

        self.cfg = cfg
        self.block_size = block_size
        self.prof = latency_profile(cfg.profile)
        if cfg.long_prefill_token_threshold is not None:
            self.prof = replace(self.prof, long_prefill_token_threshold=cfg.long_prefill_token_threshold)
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
        self.rank = {inst.id: k for k, inst in enumerate(self.instances)}
        """Worker id → its place in `instances` (the order every per-tick pass keeps)."""
        self.stalled: dict[str, SimInstance] = {}
        """Instances whose last step found nothing it could schedule, work left: each tick retries them."""
        self.expiring = any(inst.engine.policy.rejects_past_deadline for inst in self.instances)
        """Some engine rejects waiting requests past their deadline (SimEngineCore.expire): every tick asks each."""
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
        cores = [self.router, self.queue, self.admission, *([self.macro] if self.macro is not None else [])]
        self.receivers = [c.on_heartbeat for c in cores]
        self.keepers = [c.on_keepalive for c in cores]
        """Heartbeats go to these cores; an unchanged worker's repeat goes as a keep-alive."""
        self._fold = cfg.fold_decodes and cfg.mode != "pd"
        """Fold engines' decode steps (fold.py) between the events that look at them. Not in
        spatial P/D, where any prefill worker's step may send a KV_ARRIVE sooner than that."""
        self._across = self._fold and cfg.fold_ticks and self.macro is None
        """Fold across ticks (across.py) where the queue is empty and only a TICK is queued:
        without a macro-instance controller, such a tick reads an engine only through its
        stats. (Mitosis, phases and controls come from the controller.)"""
        self.next_arrival = float("inf")
        """The next arrival's time (the loop keeps it: a fold ends before it; inf: none is left)."""
        self.quiet_ticks = cfg.quiet_ticks and self.macro is None
        """Silent ticks (tick.py): a tick that another follows before the next arrival, with
        the queue empty and nothing else queued, holds changed workers' heartbeats back."""
        self._ticks_key: tuple[float, float] | None = None
        self._ticks: Ticks | None = None
        """across.Ticks for the latest (first tick, horizon): the engines folding across the
        same ticks share it."""
        self.engine_options = dict(
            chunked_prefill=cfg.chunked_prefill, prefill_only_phase=cfg.prefill_only_phases,
            max_model_len=cfg.max_model_len,
        )
        self.num_blocks, self.tpot_ms, self.width = num_blocks, tpot_ms, width
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

    def add_instance(self, inst: SimInstance) -> None:
        """A worker joins the fleet (mitosis): last in every per-tick pass."""
        self.rank[inst.id] = len(self.instances)
        self.instances.append(inst)
        self.by_id[inst.id] = inst
        self.expiring = self.expiring or inst.engine.policy.rejects_past_deadline

    # ── the loop ──
    def run(self, items: list[TraceRequest]) -> None:
        wall0 = time.perf_counter()
        ev = self.events
        k, n = 0, len(items)
        self.next_arrival = items[0].arrival_s if n else float("inf")
        tick(self, 0.0)
        while k < n or len(ev):
            if k < n and items[k].arrival_s <= ev.peek_t():
                t = items[k].arrival_s
                self.now = t
                self.arrive(items[k], t)
                k += 1
                continue
            self.next_arrival = items[k].arrival_s if k < n else float("inf")
            t, kind, data = ev.pop()
            self.now = t
            if kind == STEP_DONE:
                self._step_done(data, t)
            elif kind == TICK:
                tick(self, t, more=k < n)
            elif kind == DISPATCH:
                self.dispatch(t)
            elif kind == KV_ARRIVE:
                place_leg(self, data, t)
            elif kind == PROVISION:
                scaling.provisioned(self, data, t)
        self.wall_s = time.perf_counter() - wall0

    def arrive(self, item: TraceRequest, now: float) -> None:
        """One trace request arrives: admission, the queue, a dispatch (an event step, as `place`
        and `start` are: public, so that tests can watch each)."""
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
            st.error, st.refused_code = f"status_{verdict.status}", verdict.reason or verdict.code
            st.message = verdict.message
            return
        st.ttft_budget_s = verdict.deadline_s - now if verdict.deadline_s > 0 else 0.0
        self.queue.offer(verdict, now)
        self.dispatch(now)

    def dispatch(self, now: float) -> None:
        for req, rejected in self.queue.expire(now):
            st = self.reqs[req.request_id]
            st.error, st.message = f"status_{rejected.status}", rejected.message
            st.expired = True
        for req in self.queue.dispatchable(now):
            self.place(req, now)

    def place(self, req: schemas.AdmittedRequest, now: float) -> None:
        """One released request offered worker by worker, as the router's Placement picks them."""
        placement = Placement(self.router, req, only=self.queue.placed_on.get(req.request_id))
        while (choice := placement.next(now)) is not None:
            inst = self.by_id[choice.worker_id]
            reply, start = inst.worker.offer(req, inst.engine.stats(), choice.prefill)
            if reply.accepted:
                self.queue.on_routed(req.request_id, inst.id, now)
                if start:
                    self.start(inst, req, now)
                return
            placement.refused(inst.id, reply.reason)
        self.queue.on_not_routed(req.request_id, now)
        if self.queue.paused_until > self._dispatch_at:  # one retry event per back-off, not one per request
            self._dispatch_at = self.queue.paused_until
            self.events.push(self._dispatch_at, DISPATCH)

    def start(self, inst: SimInstance, req: schemas.AdmittedRequest, now: float) -> None:
        # a fold across ticks ends before anything is placed: no tick ahead sees this request
        assert not inst.ahead or inst.ahead[-1][0] < now, "a request placed inside a fold across ticks"
        st = self.reqs[req.request_id]
        st.worker = inst.id
        try:
            if req.kv_from:
                inst.engine.add_prefilled(req, st.cached_tokens)
            else:
                inst.engine.add(req)
        except ValueError as e:  # larger than the engine's whole KV cache: the live worker errors too
            inst.worker.streams.pop(req.request_id, None)
            st.error, st.message = "engine_refused", str(e)
            return
        inst.dirty = True
        if not inst.busy:
            self.step(inst, now)

    def step(self, inst: SimInstance, now: float, fold: bool = False) -> None:
        """Start the engine's next step at `now`. With `fold` (from its own STEP_DONE, where
        nothing else looks at it before the next event that is not a step): its pure decode
        steps up to that event as one (fold.py), with the same times, tokens and blocks."""
        res = None
        if fold and self._fold:
            ev, arrival = self.events, self.next_arrival
            until = min(arrival, ev.next_look_t())
            if until < arrival and self._across and ev.only_tick() and not len(self.queue):
                if self._ticks is None or self._ticks_key != (until, arrival):
                    self._ticks_key = (until, arrival)
                    self._ticks = Ticks(until, arrival, self.cfg.heartbeat_s, self.quiet_ticks,
                                        self.sample_times[-1] if self.sample_times else None, self.cfg.sample_s)
                res = fold_across(inst, now, self._ticks, arrival)
            else:
                res = inst.engine.fold(now, until, straddle=True)
        if res is None:
            res = inst.engine.step()
            if res.duration_s <= 0.0 and not res.outputs:
                inst.busy = False  # nothing could be scheduled; the next tick tries again
                self.stalled[inst.id] = inst
                return
            inst.busy_s += res.duration_s
            end = now + res.duration_s
        else:
            # the clock and the busy time, added step by step (left to right, as one step at a
            # time adds them: the same floats), each in one C-level pass
            times = list(accumulate(res.step_durations, add, initial=now))
            end = times[-1]
            del times[0]
            inst.busy_s = reduce(add, res.step_durations, inst.busy_s)
            inst.fold_times = times
        inst.busy = True
        inst.dirty = True
        if self.stalled:
            self.stalled.pop(inst.id, None)
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
            hand_off(self, inst, now)
        if self._on_kv is not None:
            events = inst.engine.pool.drain_events()
            if events:
                self._on_kv(inst.id, KVEventBatch(ts=now, events=events), now)
        else:
            inst.engine.pool.events.clear()
        if inst.engine.has_work():
            self.step(inst, now, fold=True)
        else:
            inst.busy = False
