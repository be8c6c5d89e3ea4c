"""What the tokenyard worker costs on top of vLLM: the same engine driven directly
(AsyncLLM in this process) and through a `tokenyard worker --engine vllm` process (requests
in over NATS on `llm.v1.worker.<id>.generate`, as the router sends them; token chunks back
over NATS to this process's inbox), same tiny model, same requests, at 1, 16 and 64
concurrent streams.

    python -m bench.vllm_worker_overhead [--streams 1,16,64] [--prompt-len 128] [--output-len 64]
                                         [--requests-per-stream 4] [--min-requests 32] [--repeats 3]
                                         [--stream-interval 1] [--json FILE]

Each stream sends its requests one after the other (closed loop; max(streams ×
requests-per-stream, min-requests) requests per setting); distinct seeded prompts
(no prefix-cache hits), temperature 0, fixed output length (the tiny model has no EOS).
Per setting: output throughput = output tokens / wall time of the run; TTFT = time from
sending a request (AsyncLLM.generate / the NATS request to the worker) to its first token,
mean and median. Both engines start once and stay up (an idle vLLM engine takes no CPU);
after a discarded warm-up wave each, every setting runs as a pair (direct then worker, the
order alternating by round) for `--repeats` rounds, with the same prompts within a pair
and new ones each round. The verdict takes the median over rounds of each pair's

    throughput kept = worker throughput / direct throughput      target ≥ 0.95
    TTFT added      = worker TTFT − direct TTFT (medians, ms)    target ≤ 2 ms

so that the drift of a shared machine hits both sides of a pair alike. Each run records
the 1-minute load average beside its figures, and the CPU time spent per output token by
the host side (direct: this process, i.e. AsyncLLM's front end and the consumer; worker:
this client + the worker process + nats-server) and by vLLM's engine processes: a figure a
busy machine disturbs far less than throughput or latency.

On a CPU-only machine the engine computes on the same cores as the worker, NATS and this
client, so every CPU cycle the worker path spends is taken from the engine: this is the
worst case for the throughput ratio (on a GPU host the engine's work is on the GPU).

Exit code 0 when every target is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench._out import write_result

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


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (gone ones count 0)."""
    import psutil  # comes with vLLM

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def descendants(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


async def closed_loop(streams: int, work: list[list[int]], one, cpu: dict[str, list[int]] | None = None) -> dict[str, float]:
    """`streams` tasks share the request list; `one(tokens)` returns (ttft_s, output tokens).
    With `cpu` (label → pids), the CPU those processes spent per output token, in µs."""
    before = {k: cpu_s(v) for k, v in (cpu or {}).items()}
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
    r = summarize(ttfts, total, time.perf_counter() - t0)
    for k, v in (cpu or {}).items():
        r[f"cpu_us_per_token_{k}"] = (cpu_s(v) - before[k]) / total * 1e6
    return r


# ───────────────────────────── direct: AsyncLLM in this process ─────────────────────────────


class Direct:
    name = "direct"

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.n = 0
        self.skip_pids: list[int] = []

    async def start(self) -> None:
        from tokenyard.services.worker.vllm.engine import drop_prometheus_logger
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase

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
            disable_log_stats=True, seed=0, stream_interval=a.stream_interval,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                            endpoint=f"ipc://{self.tmp}/kv", topic=""),
        ), stat_loggers=[Scheduler])
        drop_prometheus_logger(self.llm)

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

    def cpu_groups(self, nats_pid: int) -> dict[str, list[int]]:
        """host: this process (AsyncLLM's front end and the consumer); engine: vLLM's
        engine-core and model processes (this process's children but nats-server and the
        worker's tree)."""
        others = {nats_pid, *(self.skip_pids or [])}
        mine = [p for p in descendants(os.getpid()) if p not in others]
        return {"host": [os.getpid()], "engine": mine}

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
        from tokenyard.shared import natsutil, subjects

        a = self.args
        cmd = [sys.executable, "-m", "tokenyard.cli", "worker", "--engine", "vllm", "--nats", self.url,
               "--id", WORKER_ID, "--model", a.model, "--dtype", a.dtype, "--enforce-eager",
               "--kv-cache-memory-gb", str(a.kv_cache_gb), "--stream-interval", str(a.stream_interval)]
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
        from tokenyard.shared import codec, schemas, subjects
        from tokenyard.shared.schemas import AdmittedRequest, Sampling

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

    def cpu_groups(self, nats_pid: int) -> dict[str, list[int]]:
        """host: what the worker path adds around the engine (this client, the worker
        process, nats-server); engine: vLLM's engine-core and model processes."""
        return {"host": [os.getpid(), self.proc.pid, nats_pid], "engine": descendants(self.proc.pid)}

    async def _on_event(self, msg) -> None:
        """One subscription for every stream (as the edge has): dispatch by subject."""
        from tokenyard.shared import codec, schemas

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
    from tokenyard.shared import natsutil

    work_dir = tempfile.mkdtemp(prefix="ty-bench-vllm-")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(work_dir, "cache"))
    if not args.model:
        from tests.vllm_tiny_model import build

        args.model = str(build(os.path.join(work_dir, "tiny-llama")))
    from tokenyard.shared.tokenizer import HFTokenizer

    vocab = HFTokenizer(args.model).vocab_size
    server = await natsutil.NatsServer().start()
    streams = [int(s) for s in args.streams.split(",")]
    runs: dict[str, dict[int, list[dict[str, float]]]] = {"direct": {}, "worker": {}}
    sides = [Direct(args), ThroughWorker(args, server.url, work_dir)]
    try:
        for side in sides:  # both stay up (an idle engine takes no CPU); measured one at a time
            print(f"{side.name}: starting the engine …", flush=True)
            await side.start()
            await closed_loop(max(streams), prompts(max(streams), args.prompt_len, vocab, seed=10_000), side.one)
        worker_tree = [sides[1].proc.pid, *descendants(sides[1].proc.pid)]
        sides[0].skip_pids = worker_tree
        groups = {side.name: side.cpu_groups(server.proc.pid) for side in sides}
        for rnd in range(args.repeats):
            for c in streams:
                n = max(c * args.requests_per_stream, args.min_requests)
                work = prompts(n, args.prompt_len, vocab, seed=1000 * rnd + c)  # new prompts: no cache hits
                for side in sides if rnd % 2 == 0 else reversed(sides):  # pairs, order alternating
                    r = await closed_loop(c, [list(p) for p in work], side.one, groups[side.name])
                    r["load_avg_1m"] = os.getloadavg()[0]
                    runs[side.name].setdefault(c, []).append(r)
                    print(f"  round {rnd + 1} {side.name:6} streams={c:3}  {r['output_throughput']:8.1f} tok/s  "
                          f"TTFT mean {r['mean_ttft_ms']:7.2f} ms  median {r['median_ttft_ms']:7.2f} ms  "
                          f"CPU/token host {r['cpu_us_per_token_host']:5.1f} µs engine "
                          f"{r['cpu_us_per_token_engine']:5.1f} µs  (load {r['load_avg_1m']:.1f})", flush=True)
    finally:
        for side in sides:
            with contextlib.suppress(Exception):
                await side.stop()
        server.stop()
        if args.keep:
            print(f"kept: {work_dir} (worker.log, the tiny model)")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)

    def med(name: str, c: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[name][c])

    result: dict[str, Any] = {"model": args.model, "prompt_len": args.prompt_len, "output_len": args.output_len,
                              "stream_interval": args.stream_interval,
                              "requests_per_stream": args.requests_per_stream, "rounds": args.repeats,
                              "cpus": os.cpu_count(),
                              "by_streams": {}, "runs": runs}
    ok = True
    for c in streams:
        d_tp, w_tp = med("direct", c, "output_throughput"), med("worker", c, "output_throughput")
        pairs = zip(runs["direct"][c], runs["worker"][c], strict=True)
        row = {
            "direct_output_throughput": d_tp, "worker_output_throughput": w_tp,
            # median over rounds of each round's paired ratio / difference
            "throughput_kept": statistics.median(w["output_throughput"] / d["output_throughput"] for d, w in pairs),
            "ttft_added_ms": statistics.median(w["median_ttft_ms"] - d["median_ttft_ms"]
                                               for d, w in zip(runs["direct"][c], runs["worker"][c], strict=True)),
            "direct_median_ttft_ms": med("direct", c, "median_ttft_ms"),
            "worker_median_ttft_ms": med("worker", c, "median_ttft_ms"),
            "direct_mean_ttft_ms": med("direct", c, "mean_ttft_ms"),
            "worker_mean_ttft_ms": med("worker", c, "mean_ttft_ms"),
        }
        for side in ("direct", "worker"):
            for part in ("host", "engine"):
                row[f"{side}_cpu_us_per_token_{part}"] = med(side, c, f"cpu_us_per_token_{part}")
        row["worker_added_host_cpu_us_per_token"] = (
            row["worker_cpu_us_per_token_host"] - row["direct_cpu_us_per_token_host"])
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
    print("host CPU per output token (µs; direct: this process; worker: client + worker process + nats-server):")
    for c, r in result["by_streams"].items():
        print(f"{c:>7}  direct {r['direct_cpu_us_per_token_host']:6.1f}   worker {r['worker_cpu_us_per_token_host']:6.1f}"
              f"   added {r['worker_added_host_cpu_us_per_token']:+6.1f}")


NEEDS = ("vllm", "transformers")
"""What the bench imports beyond tokenyard's own dependencies: the `vllm` extra."""


def missing_extra() -> str | None:
    """Why the bench cannot run here (one line, what to install), or None."""
    import importlib.util

    absent = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (f"bench/vllm_worker_overhead.py needs vLLM ({', '.join(absent)} not installed): "
            "bash deploy/bootstrap.sh test,vllm (vLLM's CPU build), or pip install -e '.[vllm-cuda]' on a GPU host")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model path (default: build the tiny test model)")
    p.add_argument("--dtype", default="float16", help="the model's weight and compute type, on both sides (default: %(default)s)")
    p.add_argument("--streams", default="1,16,64",
                   help="concurrent streams of each setting, comma list, one setting each (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens of every request (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens of every request (default: %(default)s)")
    p.add_argument("--requests-per-stream", type=int, default=4,
                   help="requests each stream sends, one after the other (default: %(default)s)")
    p.add_argument("--min-requests", type=int, default=32, help="requests per setting at least")
    p.add_argument("--repeats", type=int, default=3, help="rounds of paired runs")
    p.add_argument("--kv-cache-gb", type=float, default=0.5,
                   help="GPU memory for the KV cache of each engine, GiB (default: %(default)s)")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="vLLM's stream_interval on both sides: tokens per chunk after the first")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--keep", action="store_true", help="keep the work dir (worker log, tiny model)")
    args = p.parse_args(argv)
    if why := missing_extra():
        raise SystemExit(why)
    try:  # the loop the worker runs on (shared.service), on both sides
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(run(args))
    print_table(result)
    write_result(args.json, result)
    return 0 if result["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
