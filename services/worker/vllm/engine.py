"""The vLLM engine as a tokenyard `Engine`: vLLM's AsyncLLM in the worker's process (its
engine core runs in a child process vLLM spawns), the sibling of the simulated engine's
adapter (services/worker/sim/engine.py).

    generate(req)  prompt token ids from admission → AsyncLLM.generate(TokensInput,
                   SamplingParams(DELTA), request_id, priority=class) → EngineOutput per
                   delta (new token ids, finish reason, cached prompt tokens)
    abort(id)      AsyncLLM.abort; the stream ends with vLLM's "abort" output. An abort that
                   overtakes its request is remembered and ends that request at once; a
                   consumer that goes away (closes or cancels the stream) aborts it too.
    stats()        StatsTracker fed by a StatLoggerBase every engine step + what the worker
                   tracks itself (queued prefill tokens, open requests) + the running
                   decodes' TPOT slack, from the tokens it streams (below)
    drain_kv_events()  vLLM's ZMQ KV events (PUB on an ipc:// socket in a private temp dir,
                   SUB here) translated to fleet hashes by KVHashRelay

TPOT slack (the decode term of flow control, the worker's `saturated` refusal and admission's
decode-capacity refusal): the adapter sees every token of every running request and when it
came, so it keeps the simulated engine's SlackClock on the wall clock — each request's first
token time, its tokens since, its TPOT SLO (its own `tpot_slo_ms`, else
shared.slo.DEFAULT_TPOT_SLO_MS) and max_tokens — and reports the tightest running decode's

    saved slack = (g + 1 + k)·SLO − (now − t_first) − k·d      (shared.ecoserve.saved_slack_ms)

at heartbeat time, d = the decode-only step time it measures (stats.py; the EWMA of all
steps until one is measured), k = max_tokens − 2 − g. None while nothing decodes.

A request that carries only block hashes (trace replay without text) cannot run on a real
model: generate() refuses it with a ValueError naming the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
import zmq
from tokenyard.services.worker.engine import EarlyAborts, EngineOutput, EngineStats
from tokenyard.services.worker.sim.slack import SlackClock
from tokenyard.services.worker.vllm.kv_relay import KVHashRelay
from tokenyard.services.worker.vllm.settings import VllmSettings, engine_kwargs, vllm_priority
from tokenyard.services.worker.vllm.stats import StatsTracker
from tokenyard.shared import telemetry
from tokenyard.shared.schemas import AdmittedRequest, KVEvent
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.distributed.kv_events import KVEventBatch
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs.engine import tokens_input
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerBase

log = telemetry.logger("worker.vllm")


def platform_name() -> str:
    """vLLM's platform as settings.engine_kwargs names it: cuda, rocm, xpu, cpu, …"""
    p = current_platform
    for name in ("rocm", "cuda", "xpu", "cpu", "tpu"):
        if getattr(p, f"is_{name}", lambda: False)():
            return name
    return str(p.device_type)


EXTRAS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens")
"""Sampling fields passed to vLLM as the client gave them (its defaults where it gave none)."""


def sampling_params(req: AdmittedRequest) -> SamplingParams:
    s = req.sampling
    return SamplingParams(
        max_tokens=req.max_tokens,
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        seed=s.seed,
        stop=list(s.stop) if s.stop else None,
        ignore_eos=s.ignore_eos,
        **{name: value for name in EXTRAS if (value := getattr(s, name)) is not None},  # else vLLM's defaults
        output_kind=RequestOutputKind.DELTA,
        # The worker decodes token ids itself; vLLM's detokenizer is needed only for stop strings.
        detokenize=bool(s.stop),
    )


@dataclass
class _Open:
    prompt_len: int
    first_output: bool = False
    abort_requested: bool = False


def _computed_prompt_tokens(iteration_stats) -> int:
    """Prompt tokens vLLM computed (not served from its prefix cache) for the prefills that
    completed in this step."""
    if iteration_stats is None:
        return 0
    tokens = getattr(iteration_stats, "prompt_token_stats", None)
    return tokens.computed if tokens is not None else getattr(iteration_stats, "num_prompt_tokens", 0)


def _stat_logger_class(tracker: StatsTracker) -> type[StatLoggerBase]:
    class TokenyardStatLogger(StatLoggerBase):
        """Per-engine stat logger: each step's SchedulerStats into the worker's tracker."""

        def __init__(self, vllm_config, engine_index: int = 0):
            cache = vllm_config.cache_config
            tracker.configure(cache.num_gpu_blocks or 0, cache.block_size)

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                pcs = scheduler_stats.prefix_cache_stats
                tracker.on_step(
                    running=scheduler_stats.num_running_reqs,
                    waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                    kv_usage=scheduler_stats.kv_cache_usage,
                    prefix_hits=pcs.hits if pcs else 0,
                    prefix_queries=pcs.queries if pcs else 0,
                    now=time.monotonic(),
                    prompt_tokens_computed=_computed_prompt_tokens(iteration_stats),
                )
            if iteration_stats is not None and iteration_stats.num_preempted_reqs:
                tracker.on_preempted(iteration_stats.num_preempted_reqs)

        def log_engine_initialized(self):
            pass

    return TokenyardStatLogger


def drop_prometheus_logger(llm: AsyncLLM) -> None:
    """vLLM adds its Prometheus logger next to any custom one. The worker exports its own
    state (heartbeats; the edge's /metrics), and vLLM's logger took about a tenth of the
    worker process's Python time in a 64-stream profile, for gauges nobody reads: only the
    worker's logger stays."""
    mgr = getattr(llm, "logger_manager", None)
    if mgr is not None and isinstance(getattr(mgr, "stat_loggers", None), list):
        mgr.stat_loggers = [sl for sl in mgr.stat_loggers if not isinstance(sl, PrometheusStatLogger)]


class VllmEngine:
    name = "vllm"

    def __init__(self, settings: VllmSettings, remember_aborts: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        """`clock`: the time tokens are seen and heartbeats asked at (monotonic seconds)."""
        self.settings = settings
        self.llm: AsyncLLM | None = None
        self.clock = clock
        self.tracker = StatsTracker(settings.fleet_block_size)
        self.slack = SlackClock()
        self.relay = KVHashRelay(settings.fleet_block_size)
        self.kv_batches_missed = 0
        self._open: dict[str, _Open] = {}
        self._early_aborts = EarlyAborts(remember_aborts)
        self._kv_events: list[KVEvent] = []
        self._kv_seq = -1
        self._tmp: str | None = None
        self._zmq: zmq.Context | None = None
        self._sub: zmq.Socket | None = None
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)

    # ───────────────────────────── life cycle ─────────────────────────────

    async def start(self) -> None:
        if self.llm is not None:
            return
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # one node: no interface guessing
        self._tmp = tempfile.mkdtemp(prefix="ty-vllm-")
        endpoint = f"ipc://{self._tmp}/kv"
        kw = engine_kwargs(self.settings, platform_name(), endpoint)
        kw["kv_events_config"] = KVEventsConfig(**kw["kv_events_config"])
        if "kv_transfer_config" in kw:
            kw["kv_transfer_config"] = KVTransferConfig(**kw["kv_transfer_config"])
        # Subscribe before the publisher binds (ZMQ reconnects), so no early event is missed.
        self._zmq = zmq.Context()
        self._sub = self._zmq.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.connect(endpoint)
        try:
            # from_engine_args blocks while the engine core starts (seconds): off the loop.
            self.llm = await asyncio.to_thread(
                AsyncLLM.from_engine_args, AsyncEngineArgs(**kw), stat_loggers=[_stat_logger_class(self.tracker)]
            )
            drop_prometheus_logger(self.llm)
            # Cached after the first call; warmed here so that add_request registers a
            # request before its first await (an abort can then never miss it).
            await self.llm.get_supported_tasks()
        except BaseException:
            if self.llm is not None:
                llm, self.llm = self.llm, None
                await asyncio.to_thread(llm.shutdown)
            await self._close_sockets()
            raise
        log.info("vllm_engine_started", model=self.settings.model, blocks=self.tracker.num_blocks,
                 block_size=self.tracker.block_size, fleet_block_size=self.settings.fleet_block_size)

    async def stop(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            for rid in list(self._open):
                with contextlib.suppress(Exception):
                    await llm.abort(rid)
            await asyncio.to_thread(llm.shutdown)
        self._drain_socket()
        await self._close_sockets()

    async def _close_sockets(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def kv_block_size(self) -> int:
        """vLLM's KV block size (known once started): the granularity of its prefix cache."""
        return self.tracker.block_size

    async def reset_prefix_cache(self) -> bool:
        """Drop every evictable cached block (AllBlocksCleared follows); False while requests
        still hold blocks."""
        assert self.llm is not None
        return bool(await self.llm.reset_prefix_cache())

    # ───────────────────────────── requests ─────────────────────────────

    async def generate(self, req: AdmittedRequest) -> AsyncIterator[EngineOutput]:
        rid = req.request_id
        if not req.prompt_token_ids:
            raise ValueError(
                f"request {rid} carries block hashes only (a trace replay without text): the vLLM engine "
                "needs prompt token ids; replay such traces on the simulated engine"
            )
        if self.llm is None:
            raise RuntimeError("the vLLM engine is not started")
        if rid in self._open:
            raise ValueError(f"request {rid} is already running on this engine")
        state = _Open(len(req.prompt_token_ids))
        self._open[rid] = state
        self.tracker.queued_prefill += state.prompt_len
        self.tracker.on_arrival(time.monotonic())
        finished = False
        stream = None
        try:
            if self._early_aborts.take(rid):
                finished = True
                yield EngineOutput(rid, [], True, "abort")
                return
            stream = self.llm.generate(
                tokens_input(list(req.prompt_token_ids)), sampling_params(req), rid,
                priority=vllm_priority(req.priority),
            )
            async for out in stream:
                if not state.first_output:
                    state.first_output = True
                    self.tracker.queued_prefill -= state.prompt_len
                comp = out.outputs[0] if out.outputs else None
                finished = out.finished
                output = EngineOutput(
                    rid,
                    list(comp.token_ids) if comp else [],
                    finished,
                    ((comp.finish_reason if comp else None) or "abort") if finished else None,
                    out.num_cached_tokens or 0,
                )
                self.slack.advance_to(self.clock())
                self.slack.on_step(0.0, [output], lambda _: req.tpot_slo_ms, lambda _: req.max_tokens)
                yield output
                if finished:
                    return
                if state.abort_requested:
                    # Once more, now that vLLM surely knows the request. (No await lies between
                    # `_open` taking the id and vLLM registering it, so this is a guard only.)
                    state.abort_requested = False
                    await self.llm.abort(rid)
            if not finished:  # vLLM's stream ended without a final output
                finished = True
                yield EngineOutput(rid, [], True, "abort")
        finally:
            if not state.first_output:
                self.tracker.queued_prefill -= state.prompt_len
            self._open.pop(rid, None)
            self.slack.forget(rid)
            if not finished and self.llm is not None:  # the consumer went away: free the slot
                with contextlib.suppress(Exception):
                    await self.llm.abort(rid)
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    async def abort(self, request_id: str) -> None:
        state = self._open.get(request_id)
        if state is None:
            self._early_aborts.add(request_id)
            return
        state.abort_requested = True
        if self.llm is not None:
            await self.llm.abort(request_id)

    # ───────────────────────────── state ─────────────────────────────

    def stats(self) -> EngineStats:
        t = self.tracker
        slack = self.slack.min_slack_ms(t.decode_step_ms or t.step_time_ms, self.clock())
        return t.snapshot(open_requests=len(self._open), queued_prefill_tokens=t.queued_prefill, tpot_slack_ms=slack)

    def drain_kv_events(self) -> list[KVEvent]:
        self._drain_socket()
        out, self._kv_events = self._kv_events, []
        return out

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq < 0:  # the publisher's end-of-replay marker
            return
        if self._kv_seq >= 0 and seq != self._kv_seq + 1:
            self.kv_batches_missed += max(0, seq - self._kv_seq - 1)
            log.warning("kv_events_gap", expected=self._kv_seq + 1, got=seq)
        self._kv_seq = seq
        batch = self._decoder.decode(frames[2])
        self._kv_events.extend(self.relay.translate(batch.events))

    def _drain_socket(self) -> None:
        """Translate every batch already received. ZMQ's I/O thread queues them (no high-water
        mark on this socket, so none is dropped between two polls of the shell)."""
        if self._sub is None:
            return
        while True:
            try:
                frames = self._sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._on_message(frames)
            except Exception:
                log.exception("kv_events_decode_failed")
