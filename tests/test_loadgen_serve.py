"""run_bench end to end against small fakes: a real nats-server with a fake admission that
answers every submit with Accepted, one Chunk per max_token and Finished; an aiohttp fake of
the edge's SSE; and an in-process target for the pacing and the concurrency cap. Expected
totals come from the same seeded workload, so every count is exact."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from tokenyard.loadgen import cli
from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.serve import drive, run_bench
from tokenyard.loadgen.workload import BenchRequest, make_workload
from tokenyard.shared import codec, natsutil, schemas, subjects


@pytest.fixture(scope="module")
async def nats_url(plain_nats):
    return plain_nats.url


@asynccontextmanager
async def fake_admission(url: str, reject_priority: int | None = None, silent_priority: int | None = None):
    """Rejects one class with 429, leaves one class hanging after Accepted, serves the rest."""
    nc = await natsutil.connect(url, "fake-admission")

    async def handle(msg) -> None:
        as_json = codec.is_json(msg.headers)
        req = codec.decode(msg.data, schemas.GenerateRequest, json=as_json)
        rid, n = req.request_id, req.max_tokens

        async def send(event) -> None:
            await nc.publish(msg.reply, codec.encode(event, json=as_json))

        assert req.stream and req.ignore_eos and req.model == "m"
        tier = int(msg.headers["x-request-tier"].removeprefix("P"))  # the class is asked for by header
        if tier == reject_priority:
            await send(
                schemas.Rejected(rid, 429, "rate_limit_exceeded", "tenant over its rate", retry_after_s=1.0)
            )
            return
        plen = len(req.prompt)
        await send(schemas.Accepted(rid, req.priority, plen))
        if tier == silent_priority:
            return
        for seq in range(n):
            await send(schemas.Chunk(rid, seq, "x", [120]))
        await send(schemas.Chunk(rid, 0, "x", [120]))  # a duplicate: the client drops it
        await send(schemas.Finished(rid, n, "length", schemas.Usage(plen, n, plen + n)))

    sub = await nc.subscribe(subjects.SUBMIT, cb=handle)
    await nc.flush()  # the SUB is at the server before the bench's first publish (another connection)
    try:
        yield
    finally:
        await sub.unsubscribe()
        await nc.drain()


def expected(cfg: BenchConfig, failing: set[int]) -> tuple[list[BenchRequest], list[BenchRequest]]:
    reqs = list(make_workload(cfg).requests())
    return [r for r in reqs if r.priority not in failing], [r for r in reqs if r.priority in failing]


def small(target: str, **kw) -> BenchConfig:
    args = dict(
        target=target, model="m", num_prompts=40, input_len=32, output_len=6, range_ratio=0.5,
        priority_mix=(0.25, 0.75, 0.0, 0.0), seed=7, progress=False, request_timeout_s=5.0,
    )  # fmt: skip
    return BenchConfig(**{**args, **kw})


async def test_run_bench_over_nats(nats_url):
    cfg = small(nats_url, concurrency=8, goodput={"ttft": 10_000})
    ok, bad = expected(cfg, failing={0})
    assert ok and bad
    async with fake_admission(nats_url, reject_priority=0):
        result = await run_bench(cfg)
    assert result["completed"] == len(ok)
    assert result["failed"] == len(bad)
    assert result["errors"] == {"status_429": len(bad)}
    assert result["total_output_tokens"] == sum(r.max_tokens for r in ok)
    assert result["total_input_tokens"] == sum(r.prompt_len for r in ok)
    assert result["request_goodput"] == pytest.approx(len(ok) / result["duration"])
    assert result["by_priority"]["P0"]["failed"] == len(bad) and result["by_priority"]["P0"]["completed"] == 0
    assert result["by_priority"]["P1"]["completed"] == len(ok)
    assert result["by_priority"]["P1"]["total_output_tokens"] == sum(r.max_tokens for r in ok)
    # ms, and each within the run (in seconds or µs they would fall outside these bounds)
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"] <= result["duration"] * 1000
    assert 0 < result["mean_tpot_ms"] <= result["duration"] * 1000 and 0 < result["mean_itl_ms"] <= result["duration"] * 1000
    assert (result["target"], result["num_prompts"], result["concurrency"], result["seed"]) == (
        nats_url,
        40,
        8,
        7,
    )
    assert result["rate"] == "inf" and result["workload"] == "synthetic"


async def test_request_timeout_fails_only_the_hanging_requests(nats_url):
    cfg = small(nats_url, num_prompts=12, request_timeout_s=0.3)
    ok, hanging = expected(cfg, failing={0})
    async with fake_admission(nats_url, silent_priority=0):
        result = await run_bench(cfg)
    assert (result["completed"], result["failed"]) == (len(ok), len(hanging))
    assert result["errors"] == {"timeout": len(hanging)}
    assert 0.3 <= result["duration"] < 3.0


async def test_no_admission_fails_each_request_fast(nats_url):
    result = await run_bench(small(nats_url, num_prompts=3))
    assert (result["completed"], result["errors"]) == (0, {"status_503": 3})


async def test_unreachable_nats_fails_fast():
    with pytest.raises(ConnectionError, match="cannot reach NATS"):
        await run_bench(small("nats://127.0.0.1:1", num_prompts=1, connect_timeout_s=0.5))


# ───────────────────────────── HTTP ─────────────────────────────


def sse_frame(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@asynccontextmanager
async def fake_edge(reject_priority: int | None = None):
    seen: list[dict] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if request.headers["x-request-tier"] == f"P{reject_priority}":
            return web.json_response(
                {
                    "error": {
                        "message": "over rate",
                        "type": "rate_limit_exceeded",
                        "param": None,
                        "code": None,
                    }
                },
                status=429,
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n, plen = body["max_tokens"], len(body["prompt"])
        frames = [
            sse_frame({"choices": [{"index": 0, "text": "y", "finish_reason": None}], "usage": None})
        ] * n
        frames.append(
            sse_frame({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": None})
        )
        frames.append(
            sse_frame(
                {
                    "choices": [],
                    "usage": {"prompt_tokens": plen, "completion_tokens": n, "total_tokens": plen + n},
                }
            )
        )
        frames.append(b"data: [DONE]\n\n")
        data = b"".join(frames)
        for i in range(0, len(data), 37):  # odd slices: frames split across writes
            await resp.write(data[i : i + 37])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_run_bench_over_http():
    async with fake_edge(reject_priority=0) as (url, seen):
        cfg = small(url, concurrency=4, rate=2000.0)
        result = await run_bench(cfg)
    ok, bad = expected(cfg, failing={0})
    assert (result["completed"], result["failed"]) == (len(ok), len(bad))
    assert result["errors"] == {"status_429": len(bad)}
    assert result["total_output_tokens"] == sum(r.max_tokens for r in ok)
    assert result["total_input_tokens"] == sum(r.prompt_len for r in ok)
    assert len(seen) == 40
    assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
    assert seen[0]["ignore_eos"] is True and seen[0]["model"] == "m"
    assert result["duration"] >= result["arrival_span_s"] > 0


# ───────────────────────────── pacing and the cap ─────────────────────────────


class CountingTarget:
    """In-process target: yields to the loop a few times per request, counts requests in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        record.send_s = 1.0
        for i in range(request.max_tokens):
            await asyncio.sleep(0)
            record.chunk_s.append(1.0 + (i + 1) / 100)
            record.streamed_tokens += 1
        self.in_flight -= 1

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("concurrency, most", [(3, 3), (None, 20)])
async def test_concurrency_cap(concurrency, most):
    cfg = BenchConfig(num_prompts=20, input_len=4, output_len=3, concurrency=concurrency, progress=False)
    target = CountingTarget()
    records, duration = await drive(list(make_workload(cfg).requests()), target, cfg)
    assert target.most_in_flight == most
    assert [r.index for r in records] == list(range(20)) and all(r.success for r in records)
    assert duration > 0 and math.isfinite(duration)


# ───────────────────────────── the command line ─────────────────────────────


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenyard")
    cli.register(p.add_subparsers(dest="command", required=True))
    return p


def test_cli_parses_vllm_spellings():
    args = parser().parse_args(
        ["bench", "serve", "--target", "http://h:1", "--request-rate", "50", "--max-concurrency", "4",
         "--goodput", "ttft:500", "tpot:40", "--priority-mix", "0,0.5,0.5,0", "--disable-tqdm"]
    )  # fmt: skip
    cfg = cli.config_from_args(args)
    assert (cfg.rate, cfg.concurrency, cfg.progress) == (50.0, 4, False)
    assert cfg.goodput == {"ttft": 500.0, "tpot": 40.0} and cfg.priority_mix == (0, 0.5, 0.5, 0)
    assert args.func is cli.serve_main


@pytest.mark.parametrize(
    "bad", [["--priority-mix", "1,2"], ["--workload", "no-such-workload"], ["--goodput", "foo:1"]]
)
def test_cli_bad_options_exit_2(bad, capsys):
    args = parser().parse_args(["bench", "serve", "--no-progress", *bad])
    assert cli.serve_main(args) == 2
    assert "error" in capsys.readouterr().err


async def test_cli_end_to_end_writes_result_json(nats_url, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = parser().parse_args(
        ["bench", "serve", "--target", nats_url, "--model", "m", "--num-prompts", "10", "--input-len", "8",
         "--output-len", "3", "--seed", "1", "--no-progress", "--result-json", str(out)]
    )  # fmt: skip
    async with fake_admission(nats_url):
        rc = await asyncio.to_thread(cli.serve_main, args)
    assert rc == 0
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (10, 0, 30)
    assert result["total_input_tokens"] == 80 and result["rate"] == "inf"
    assert "Serving Benchmark Result" in capsys.readouterr().out
