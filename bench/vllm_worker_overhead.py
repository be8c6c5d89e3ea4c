"""What the tokenyard worker costs on top of vLLM: the same engine driven directly
(AsyncLLM in this process) and through a `tokenyard worker --engine vllm` process (requests
in over NATS on `llm.v1.worker.<id>.generate`, as the router sends them; token chunks back
over NATS to this process's inbox), same tiny model, same requests, at 1, 16 and 64
concurrent streams.

    python -m bench.vllm_worker_overhead [--streams 1,16,64] [--prompt-len 128] [--output-len 64]
                                         [--requests-per-stream 4] [--min-requests 32] [--repeats 2]
                                         [--json FILE]

Each stream sends its requests one after the other (closed loop; max(streams ×
requests-per-stream, min-requests) requests per setting); distinct seeded prompts
(no prefix-cache hits), temperature 0, fixed output length (the tiny model has no EOS).
Per setting: output throughput = output tokens / wall time of the run; TTFT = time from
sending a request (AsyncLLM.generate / the NATS request to the worker) to its first token,
mean and median. A discarded warm-up wave precedes each engine's runs; engines run
alternately (direct, worker, direct, …) `--repeats` times and each figure is the median
over repeats, so slow drift of a shared machine hits both sides alike.

    throughput kept = worker throughput / direct throughput      target ≥ 0.95
    TTFT added      = worker TTFT − direct TTFT (median, ms)     target ≤ 2 ms

On a CPU-only machine the engine computes on the same cores as the worker, NATS and this
client, so every CPU cycle the worker path spends is taken from the engine: this is the
worst case for the throughput ratio (on a GPU host the engine's work is on the GPU).

Exit code 0 when every target is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEEP_TARGET = 0.95
TTFT_ADDED_MS = 2.0
WORKER_ID = "bench-vllm"


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(n)]


def summarize(ttfts: list[float], tokens: int, wall_s: float) -> dict[str, float]:
    return {
        "output_throughput": tokens / wall_s,
        "mean_ttft_ms": statistics.fmean(ttfts) * 1000.0,
        "median_ttft_ms": statistics.median(ttfts) * 1000.0,
        "wall_s": wall_s,
    }


async def closed_loop(streams: int, work: list[list[int]], one) -> dict[str, float]:
    """`streams` tasks share the request list; `one(tokens)` returns (ttft_s, output tokens)."""
    queue = list(reversed(work))
    ttfts: list[float] = []
    total = 0

    async def stream() -> None:
        nonlocal total
        while queue:
            ttft, n = await one(queue.pop())
            ttfts.append(ttft)
            total += n

    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(streams)))
    return summarize(ttfts, total, time.perf_counter() - t0)


# ───────────────────────────── direct: AsyncLLM in this process ─────────────────────────────


class Direct:
    name = "direct"

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.n = 0

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase

        from services.worker.vllm.engine import _drop_prometheus_logger

        class Scheduler(StatLoggerBase):  # the per-step stats the worker's heartbeats need, unread here
            def __init__(self, vllm_config, engine_index=0):
                pass

            def record(self, *args, **kwargs):
                pass

            def log_engine_initialized(self):
                pass

        a = self.args
        # The engine exactly as the worker configures it (prefix caching, priority policy, KV
        # events over ZMQ, per-step stats with vLLM's Prometheus logger dropped), so the two
        # sides differ by the worker and NATS alone.
        self.tmp = tempfile.mkdtemp(prefix="ty-direct-")
        from vllm.config import KVEventsConfig

        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, AsyncEngineArgs(
            model=a.model, dtype=a.dtype, enforce_eager=True, enable_prefix_caching=True,
            scheduling_policy="priority", kv_cache_memory_bytes=int(a.kv_cache_gb * (1 << 30)),
            disable_log_stats=True, seed=0,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                            endpoint=f"ipc://{self.tmp}/kv", topic=""),
        ), stat_loggers=[Scheduler])
        _drop_prometheus_logger(self.llm)

    async def one(self, tokens: list[int]) -> tuple[float, int]:
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        self.n += 1
        params = SamplingParams(max_tokens=self.args.output_len, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA, detokenize=False)
        t0 = time.perf_counter()
        ttft, n = 0.0, 0
        async for out in self.llm.generate(tokens_input(tokens), params, f"d{self.n}", priority=1):
            if not n and out.outputs[0].token_ids:
                ttft = time.perf_counter() - t0
            n += len(out.outputs[0].token_ids)
        return ttft, n

    async def stop(self) -> None:
        await asyncio.to_thread(self.llm.shutdown)
        del self.llm
        shutil.rmtree(self.tmp, ignore_errors=True)


# ───────────────────────────── through the worker, over NATS ─────────────────────────────


class ThroughWorker:
    name = "worker"

    def __init__(self, args: argparse.Namespace, nats_url: str, log_dir: str):
        self.args = args
        self.url = nats_url
        self.log_dir = log_dir
        self.n = 0

    async def start(self) -> None:
        from shared import natsutil, subjects

        a = self.args
        cmd = [sys.executable, "-m", "tokenyard.cli", "worker", "--engine", "vllm", "--nats", self.url,
               "--id", WORKER_ID, "--model", a.model, "--dtype", a.dtype, "--enforce-eager",
               "--kv-cache-memory-gb", str(a.kv_cache_gb)]
        self.log = open(os.path.join(self.log_dir, "worker.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        self.nc = await natsutil.connect(self.url, "bench-vllm-client")
        hb = await self.nc.subscribe(subjects.heartbeat(WORKER_ID))
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.proc.returncode}; see {self.log_dir}/worker.log")
            try:
                await hb.next_msg(timeout=1)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError("the worker did not start in 300 s") from None
        await hb.unsubscribe()
        self.inbox = self.nc.new_inbox()
        self.open: dict[str, list] = {}
        await self.nc.subscribe(f"{self.inbox}.*", cb=self._on_event)

    async def one(self, tokens: list[int]) -> tuple[float, int]:
        from shared import codec, schemas, subjects
        from shared.schemas import AdmittedRequest, Sampling

        self.n += 1
        rid = f"w{self.n}"
        ar = AdmittedRequest(
            request_id=rid, reply_to=f"{self.inbox}.{rid}", model=self.args.model, prompt_token_ids=tokens,
            prompt_len=len(tokens), block_hashes=[], block_size=16, max_tokens=self.args.output_len,
            priority=1, arrival_s=time.time(), sampling=Sampling(temperature=0.0),
        )
        done = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.open[rid] = [t0, 0.0, 0, done]
        reply = codec.decode((await self.nc.request(subjects.worker_generate(WORKER_ID), codec.encode(ar),
                                                    timeout=30)).data, schemas.GenerateReply)
        if not reply.accepted:
            raise RuntimeError(f"the worker refused {rid}: {reply.reason}")
        await asyncio.wait_for(done, 120)
        _, ttft, n, _ = self.open.pop(rid)
        return ttft, n

    async def _on_event(self, msg) -> None:
        """One subscription for every stream (as the edge has): dispatch by subject."""
        from shared import codec, schemas

        st = self.open.get(msg.subject.rsplit(".", 1)[1])
        if st is None:
            return
        event = codec.decode_event(msg.data)
        if isinstance(event, schemas.Chunk):
            if not st[2]:
                st[1] = time.perf_counter() - st[0]
            st[2] += len(event.token_ids)
        elif isinstance(event, schemas.Finished):
            st[3].set_result(None)
        elif not st[3].done():
            st[3].set_exception(RuntimeError(str(event)))

    async def stop(self) -> None:
        await self.nc.drain()
        self.proc.terminate()
        await asyncio.to_thread(self.proc.wait, 60)
        self.log.close()


# ───────────────────────────── the run ─────────────────────────────


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from shared import natsutil

    work_dir = tempfile.mkdtemp(prefix="ty-bench-vllm-")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(work_dir, "cache"))
    if not args.model:
        from tests.vllm_tiny_model import build

        args.model = str(build(os.path.join(work_dir, "tiny-llama")))
    from shared.tokenizer import HFTokenizer

    vocab = HFTokenizer(args.model).vocab_size
    server = await natsutil.NatsServer().start()
    streams = [int(s) for s in args.streams.split(",")]
    runs: dict[str, dict[int, list[dict[str, float]]]] = {"direct": {}, "worker": {}}
    try:
        for rep in range(args.repeats):
            for engine in (Direct(args), ThroughWorker(args, server.url, work_dir)):
                print(f"[repeat {rep + 1}/{args.repeats}] {engine.name}: starting the engine …", flush=True)
                await engine.start()
                try:
                    warm = prompts(max(streams), args.prompt_len, vocab, seed=10_000 + rep)
                    await closed_loop(max(streams), warm, engine.one)
                    for c in streams:
                        n = max(c * args.requests_per_stream, args.min_requests)
                        work = prompts(n, args.prompt_len, vocab, seed=c)
                        # the same prompts on both sides; a fresh cache for each (distinct per repeat)
                        work = [[(t + rep) % (vocab - 1) + 1 for t in p] for p in work]
                        r = await closed_loop(c, work, engine.one)
                        runs[engine.name].setdefault(c, []).append(r)
                        print(f"  {engine.name:6} streams={c:3}  {r['output_throughput']:8.1f} tok/s  "
                              f"TTFT mean {r['mean_ttft_ms']:7.2f} ms  median {r['median_ttft_ms']:7.2f} ms",
                              flush=True)
                finally:
                    await engine.stop()
    finally:
        server.stop()

    def med(name: str, c: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[name][c])

    result: dict[str, Any] = {"model": args.model, "prompt_len": args.prompt_len, "output_len": args.output_len,
                              "requests_per_stream": args.requests_per_stream, "repeats": args.repeats,
                              "by_streams": {}, "runs": runs}
    ok = True
    for c in streams:
        d_tp, w_tp = med("direct", c, "output_throughput"), med("worker", c, "output_throughput")
        row = {
            "direct_output_throughput": d_tp, "worker_output_throughput": w_tp, "throughput_kept": w_tp / d_tp,
            "direct_median_ttft_ms": med("direct", c, "median_ttft_ms"),
            "worker_median_ttft_ms": med("worker", c, "median_ttft_ms"),
            "direct_mean_ttft_ms": med("direct", c, "mean_ttft_ms"),
            "worker_mean_ttft_ms": med("worker", c, "mean_ttft_ms"),
        }
        row["ttft_added_ms"] = row["worker_median_ttft_ms"] - row["direct_median_ttft_ms"]
        row["meets_targets"] = row["throughput_kept"] >= KEEP_TARGET and row["ttft_added_ms"] <= TTFT_ADDED_MS
        ok &= row["meets_targets"]
        result["by_streams"][str(c)] = row
    result["meets_targets"] = ok
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'streams':>7} {'direct tok/s':>13} {'worker tok/s':>13} {'kept':>6} "
          f"{'direct TTFT':>12} {'worker TTFT':>12} {'added':>8}   (TTFT: median ms)")
    for c, r in result["by_streams"].items():
        print(f"{c:>7} {r['direct_output_throughput']:13.1f} {r['worker_output_throughput']:13.1f} "
              f"{r['throughput_kept']:6.1%} {r['direct_median_ttft_ms']:12.2f} {r['worker_median_ttft_ms']:12.2f} "
              f"{r['ttft_added_ms']:+8.2f}   {'ok' if r['meets_targets'] else 'MISSED'}")
    print(f"targets: throughput kept ≥ {KEEP_TARGET:.0%}, TTFT added ≤ {TTFT_ADDED_MS} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model path (default: build the tiny test model)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--requests-per-stream", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=32, help="requests per setting at least")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kv-cache-gb", type=float, default=0.5)
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    try:  # the loop the worker runs on (shared.service), on both sides
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(run(args))
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
