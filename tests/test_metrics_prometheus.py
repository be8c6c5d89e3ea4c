"""A real Prometheus (Debian's `prometheus` package; deploy/bootstrap.sh installs it where
apt-get exists) scrapes a fleet of processes as `tokenyard up` starts it, and its query API
returns what the client caused: every target up, every request admitted, routed and finished,
a refusal by its reason, and the vLLM-named gauges of every worker."""

from __future__ import annotations

import contextlib
import shutil
import subprocess

import aiohttp
import pytest
from tokenyard.shared import codec, metrics, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient

from tests.conftest import until
from tokenyard.launcher import FleetProcesses

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary: Debian's `prometheus` package is not installed here "
    "(deploy/bootstrap.sh installs it with apt-get where apt-get exists)",
)
N = 8


@contextlib.asynccontextmanager
async def prometheus(config: str, tmp_path):
    (tmp_path / "prometheus.yml").write_text(config)
    port = natsutil.free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await scraped(lambda: ready(http, url), "prometheus ready")
            yield http, url
    finally:
        proc.terminate()
        proc.wait(10)


async def ready(http, url) -> bool:
    try:
        async with http.get(f"{url}/-/ready") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def query(http, url: str, promql: str) -> dict[str, float]:
    """Instant query → {the series' labels as `k=v,…` → value}."""
    async with http.get(f"{url}/api/v1/query", params={"query": promql}) as r:
        body = await r.json()
    assert body["status"] == "success", body
    return {",".join(f"{k}={v}" for k, v in sorted(s["metric"].items())): float(s["value"][1])
            for s in body["data"]["result"]}


async def scraped(check, what: str):
    """Await a condition Prometheus reaches on its next scrapes (its clock, not ours)."""
    return await until(check, timeout_s=30.0, poll_s=0.25, what=what)


async def test_prometheus_scrapes_the_fleet_and_answers_queries(tmp_path):
    fleet = FleetProcesses(workers=2, profile="zero", http_port=0, log_dir=str(tmp_path / "logs"))
    await fleet.start()
    try:
        targets = fleet.scrape_targets()
        assert set(targets) == {"edge", "admission", "queue", "router", "macro", "worker-0", "worker-1"}
        async with prometheus(metrics.prometheus_config(targets, scrape_interval_s=0.5), tmp_path) as (http, url):
            nc = await natsutil.connect(fleet.nats_url, "test")
            client = TokenyardClient(nc)
            for i in range(N):
                done = await client.generate(schemas.GenerateRequest(prompt=f"scrape me {i}", max_tokens=4))
                assert done.finish_reason == "length"
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(subjects.SUBMIT, codec.encode(schemas.GenerateRequest(prompt="x", max_tokens=-1)),
                             reply=inbox)
            assert isinstance(codec.decode_event((await sub.next_msg(timeout=5)).data), schemas.Rejected)
            await nc.drain()

            async def scraped_all() -> dict | None:
                up = await query(http, url, "up")
                return up if len(up) == 7 and all(v == 1 for v in up.values()) else None

            up = await scraped(scraped_all, "every target up")
            assert {k.split("job=")[1] for k in up} == {"edge", "admission", "queue", "router", "macro", "worker"}

            async def value(promql: str, want: float) -> bool:
                got = await query(http, url, promql)
                return sum(got.values()) == want

            await scraped(lambda: value('sum(tokenyard:admission_decisions_total{outcome="admitted"})', N), "admitted")
            await scraped(lambda: value('sum(tokenyard:refusals_total{reason="invalid_value"})', 1), "refusal")
            await scraped(lambda: value('sum(tokenyard:router_decisions_total{outcome="routed"})', N), "routed")
            await scraped(lambda: value('sum(tokenyard:queue_dispatches_total{outcome="routed"})', N), "dispatched")
            await scraped(lambda: value('sum(vllm:request_success_total{finished_reason="length"})', N), "finished")
            await scraped(lambda: value("sum(vllm:generation_tokens_total)", 4 * N), "generation tokens")
            await scraped(lambda: value("sum(vllm:time_to_first_token_seconds_count)", N), "ttft histogram")
            running = await query(http, url, "vllm:num_requests_running")
            assert sorted(k.split("worker_id=")[1].split(",")[0] for k in running) == ["w0", "w1"]
            assert set(running.values()) == {0.0}
            cache = await query(http, url, "vllm:gpu_cache_usage_perc")
            assert len(cache) == 2 and all(0.0 <= v <= 1.0 for v in cache.values())
            depth = await query(http, url, "tokenyard:queue_depth")
            assert len(depth) == 4 and sum(depth.values()) == 0
    finally:
        await fleet.stop()
