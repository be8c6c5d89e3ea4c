"""`run_bench(config)`: drive one workload against one target and return the result dict.

    t0 = perf_counter()
    for each request, in arrival order:
        sleep until t0 + arrival offset, then start it as a task
        (the task waits for a concurrency slot when --concurrency is set, then sends)
    wait for every task; duration = perf_counter() − t0          (vllm's benchmark_duration)

Each request is bounded by `request_timeout_s` from the moment it is sent (a timeout is a
failure labelled `timeout`), so the run always ends: the last arrival is finite and every
task ends within the timeout of getting its slot. Any exception a transport raises fails
that one request with its class name as the reason; it never stops the run.

The result is `metrics.compute_metrics(...)` plus the run's settings (`config.describe()`)
and two diagnostics of the generator itself: `arrival_span_s` (offset of the last arrival)
and `max_send_lag_ms` (the most any request started behind its scheduled time; large
values mean the load generator, not the target, was the bottleneck).
"""

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from time import perf_counter
from typing import Any

from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.metrics import compute_metrics
from tokenyard.loadgen.records import TIMEOUT, RequestRecord
from tokenyard.loadgen.report import make_progress, print_result
from tokenyard.loadgen.targets import Target, open_target
from tokenyard.loadgen.workload import BenchRequest, make_workload

__all__ = ["BenchConfig", "print_result", "run_bench"]


async def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run one benchmark; raises ValueError for a bad config, OSError-like errors when the
    target cannot be reached at all."""
    config.validate()
    requests = sorted(make_workload(config).requests(), key=lambda r: (r.arrival_s, r.index))
    target = await open_target(
        config.target,
        config.model,
        config.request_timeout_s,
        config.concurrency,
        config.tenant,
        config.connect_timeout_s,
    )
    sampler = None
    heartbeats_from = config.fleet_nats or (config.target if config.target.startswith(("nats://", "tls://")) else None)
    if config.plots_dir and heartbeats_from:
        from tokenyard.loadgen.plots import HeartbeatSampler

        sampler = await HeartbeatSampler(heartbeats_from).start()
    try:
        records, duration = await drive(requests, target, config)
    finally:
        await target.close()
        samples = await sampler.stop() if sampler else None
    result = compute_metrics(records, duration, config.goodput or None)
    if config.plots_dir:
        from tokenyard.loadgen.plots import write_plots

        result["plots"] = write_plots(records, samples, config.plots_dir)
        if samples is None:
            result["plots_note"] = "no worker_load.png: an HTTP target tells no worker; pass --fleet-nats URL"
    result.update(config.describe())
    result["arrival_span_s"] = requests[-1].arrival_s if requests else 0.0
    result["max_send_lag_ms"] = max(((r.dispatched_s - r.scheduled_s) * 1000 for r in records), default=0.0)
    if config.per_request:
        result["requests"] = [{"index": r.index, "prompt_len": r.prompt_len,
                               "ttft_ms": r.ttft * 1000 if r.success else None, "error": r.error} for r in records]
    return result


async def send_one(target: Target, request: BenchRequest, record: RequestRecord, timeout_s: float) -> None:
    """Send one request, bounded by `timeout_s`; never raises (except cancellation)."""
    try:
        async with asyncio.timeout(timeout_s):
            await target.send(request, record)
    except TimeoutError:
        record.fail(TIMEOUT, f"no end of stream within {timeout_s:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a transport failure fails this request, not the run
        record.fail(type(e).__name__, str(e)[:200])
    finally:
        if record.send_s == 0.0:
            record.send_s = perf_counter()
        record.close(perf_counter())


async def drive(
    requests: list[BenchRequest], target: Target, config: BenchConfig
) -> tuple[list[RequestRecord], float]:
    """Pace `requests` onto `target`; return their records (in request order) and the duration."""
    slots = asyncio.Semaphore(config.concurrency) if config.concurrency else None
    progress, bar = make_progress(len(requests), config.progress)
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []
    failed = 0

    async def one(request: BenchRequest, record: RequestRecord) -> None:
        nonlocal failed
        async with slots if slots is not None else nullcontext():
            await send_one(target, request, record, config.request_timeout_s)
        failed += not record.success
        progress.update(bar, advance=1, failed=failed)

    with progress:
        t0 = perf_counter()
        try:
            for request in requests:
                due = t0 + request.arrival_s
                delay = due - perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                record = RequestRecord(
                    index=request.index,
                    priority=request.priority,
                    prompt_len=request.prompt_len,
                    tpot_slo_ms=request.tpot_slo_ms,
                    scheduled_s=due,
                    dispatched_s=perf_counter(),
                )
                records.append(record)
                tasks.append(asyncio.create_task(one(request, record)))
            await asyncio.gather(*tasks)
        except BaseException:  # interrupted: leave no request running behind us
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        duration = perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return records, duration
