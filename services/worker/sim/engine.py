"""The simulated engine on a real clock: the async adapter that makes SimEngineCore an
`Engine`. A step loop runs while there is work: plan a step, wait its duration ÷ speed
(against a running deadline, so sleep overshoot does not accumulate), then deliver the
step's outputs to each request's stream. `speed` = simulated seconds per wall second.

A policy that rejects past the deadline (SCORPIO's rejection path, SimEngineCore.expire) gets
it here as in the cluster simulator: before every step, and every EXPIRE_POLL_S (the
simulator's tick) while the requests it holds back leave nothing to run, the waiting requests
whose TTFT deadline (wall-clock, as admission stamped it) has passed are taken out; each
stream ends with finish reason `deadline`, which the worker's core turns into a 429.

A stream whose reader fell behind the steps (its worker starved of CPU, a slow subscriber
downstream) gets what piled up as one output — the tokens of several steps, the last one's
finish — as vLLM's output collector merges the deltas a slow consumer has not taken yet: one
chunk, one publish, one SSE write instead of one per token, exactly when the worker can least
afford them. A reader that keeps up sees one output per step, as before.

An abort that overtakes its request (the worker accepted the offer, the abort came before the
request's task began it here) is remembered and ends that request unstarted, as in the vLLM adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from tokenyard.services.worker.engine import EarlyAborts, EngineOutput, EngineStats
from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.overhead import StepOverhead
from tokenyard.shared import telemetry
from tokenyard.shared.schemas import AdmittedRequest, KVEvent

log = telemetry.logger("worker")

EXPIRE_POLL_S = 0.1
"""How often an idle engine holding requests back checks their deadlines (the simulator's tick)."""
HANDED_OFF = "handed_off"
"""The end of a stream on a P/D prefill worker: the request went on to a decode worker."""


class SimEngine:
    name = "sim"

    def __init__(self, core: SimEngineCore, speed: float = 1.0):
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.core = core
        self.speed = speed
        self._streams: dict[str, asyncio.Queue[EngineOutput]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self.overhead = StepOverhead()
        """What a step costs here beyond its model (overhead.py); its estimate is the core's step_overhead_s."""
        self._early_aborts = EarlyAborts()
        self.handed: dict[str, int] = {}
        """Requests handed off (spatial P/D) and not yet collected: id → num_cached_tokens."""

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass

    async def generate(self, req: AdmittedRequest) -> AsyncIterator[EngineOutput]:
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        first = _FirstToken(req, self.core.stats(), time.monotonic()) if log.is_enabled_for(logging.DEBUG) else None
        if req.kv_from:  # a P/D decode leg: its KV crosses the inter-node link, then it decodes
            await asyncio.sleep(self.core.prof.network_s(req.prompt_len) / self.speed)
        if self._early_aborts.take(req.request_id):  # its abort came first: it ends unstarted
            yield EngineOutput(req.request_id, [], True, "abort")
            return
        if req.kv_from:
            self.core.add_prefilled(req)
        else:
            self.core.add(req)
        self._streams[req.request_id] = queue
        self._wake.set()
        try:
            while True:
                out = await queue.get()
                handed_off = out.finish_reason == HANDED_OFF
                while not handed_off and not out.finished and not queue.empty():  # the reader fell behind
                    nxt = queue.get_nowait()
                    handed_off = nxt.finish_reason == HANDED_OFF
                    if not handed_off:
                        out = _merge(out, nxt)
                if first is not None and out.new_token_ids:
                    first.log(out.num_cached_tokens)
                    first = None
                if out.finish_reason != HANDED_OFF:
                    yield out
                if out.finished or handed_off:
                    return
        finally:
            self._streams.pop(req.request_id, None)
            if req.request_id in self.core.seqs:  # the consumer went away: free the slot
                self.core.abort(req.request_id)
                self._wake.set()

    async def abort(self, request_id: str) -> None:
        if self.core.abort(request_id):
            self._wake.set()
        elif request_id not in self._streams and request_id not in self.handed:  # not begun yet
            self._early_aborts.add(request_id)

    def stats(self) -> EngineStats:
        return self.core.stats()

    def set_phase(self, phase: str) -> None:
        """EcoServe (issue 8): decode-only or not; a switch may unblock parked prefills."""
        if phase != self.core.phase:
            self.core.set_phase(phase)
            self._wake.set()

    def set_hand_off(self, on: bool) -> None:
        """Spatial P/D: hand each request off after its first token (a prefill worker)."""
        self.core.hand_off = on

    def take_hand_off(self, request_id: str) -> int | None:
        """The request's num_cached_tokens if it was handed off (then forgotten), else None."""
        return self.handed.pop(request_id, None)

    def drain_kv_events(self) -> list[KVEvent]:
        return self.core.pool.drain_events()

    async def _run(self) -> None:
        deadline = time.monotonic()
        delivered: float | None = None  # when the last step's outputs went out (None: idle since)
        while True:
            if not self.core.has_work():
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
                delivered = None
            self.core.expire(time.time())
            result = self.core.step()
            if result.scheduled_tokens == 0 and not result.outputs:
                # Nothing could run (decode phase with only prefills waiting, or every waiting
                # request held back by SCORPIO's VBS check): wait for a change, or a deadline.
                self._wake.clear()
                if self.core.policy.rejects_past_deadline and self.core.waiting:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), EXPIRE_POLL_S)
                else:
                    await self._wake.wait()
                deadline = time.monotonic()
                delivered = None
                continue
            deadline = max(deadline, time.monotonic() - 0.05) + result.duration_s / self.speed
            delay = deadline - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            now = time.monotonic()
            if delivered is not None:  # what a step costs on this machine beyond its modelled time
                extra = (now - delivered - result.duration_s / self.speed) * self.speed
                self.core.step_overhead_s = self.overhead.add(extra)
            delivered = now
            for out in result.outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
            for req, cached in self.core.handed_off:
                self.handed[req.request_id] = cached
                queue = self._streams.get(req.request_id)
                if queue is not None:
                    queue.put_nowait(EngineOutput(req.request_id, [], False, HANDED_OFF, cached))
            self.core.handed_off.clear()



def _merge(out: EngineOutput, nxt: EngineOutput) -> EngineOutput:
    """Two outputs of one stream as one: both steps' tokens, the later one's finish."""
    return EngineOutput(out.request_id, [*out.new_token_ids, *nxt.new_token_ids], nxt.finished, nxt.finish_reason,
                        nxt.num_cached_tokens or out.num_cached_tokens)


class _FirstToken:
    """TOKENYARD_LOG_LEVEL=debug: one `first_token` line per request — what the engine held
    when it arrived (running and waiting requests, prompt tokens queued for prefill) and what
    it did with it (prefix tokens found cached, wall ms to its first token). bench.live_router
    --route-log pairs the lines with its requests, behind any router."""

    __slots__ = ("req", "stats", "t0")

    def __init__(self, req: AdmittedRequest, stats: EngineStats, t0: float):
        self.req, self.stats, self.t0 = req, stats, t0

    def log(self, cached: int) -> None:
        s = self.stats
        log.debug("first_token", request_id=self.req.request_id, prompt_tokens=self.req.prompt_len,
                  cached_tokens=cached, arrived_s=round(time.time() - (time.monotonic() - self.t0), 4),
                  ttft_ms=round((time.monotonic() - self.t0) * 1000, 2), running=s.running, waiting=s.waiting,
                  queued_prefill=s.queued_prefill_tokens, queued_prefill_net=(s.queued_prefill_ahead_net or [None])[-1])
