"""Traces you can open: a fleet of processes exports its spans over OTLP/HTTP to a real
collector with a UI, Arize Phoenix (`phoenix serve`), and the collector's REST API returns one
request's trace with a span for every hop — edge, admission, queue, router, worker — and the
router's decision inputs as attributes.

Phoenix pins its own OpenTelemetry, protobuf and web stack, so it lives in a virtual
environment of its own (`.venv-phoenix`, made by deploy/bootstrap.sh); the test finds it there,
at $TOKENYARD_PHOENIX, or on PATH, and skips, saying so, where none is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from tokenyard.services.router.core import DEFAULT_POLICY
from tokenyard.shared import natsutil

from tests.conftest import until
from tokenyard.launcher import FleetProcesses

ROOT = Path(__file__).resolve().parent.parent


def phoenix_binary() -> str | None:
    for candidate in (os.environ.get("TOKENYARD_PHOENIX"), str(ROOT / ".venv-phoenix" / "bin" / "phoenix")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("phoenix")


PHOENIX = phoenix_binary()
pytestmark = pytest.mark.skipif(
    PHOENIX is None, reason="Arize Phoenix is not installed (deploy/bootstrap.sh puts it in .venv-phoenix; "
    "or set TOKENYARD_PHOENIX to a `phoenix` executable)")
HOPS = {"edge", "admission", "queue", "router", "worker"}


async def test_phoenix_holds_one_trace_per_request_with_every_hop(tmp_path):
    port, grpc_port = natsutil.free_port(), natsutil.free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"), "PHOENIX_HOST": "127.0.0.1",
           "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc_port)}
    log = open(tmp_path / "phoenix.log", "wb")  # noqa: SIM115
    phoenix = subprocess.Popen([PHOENIX, "serve"], env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    fleet = FleetProcesses(workers=2, profile="zero", http_port=0, log_dir=str(tmp_path / "logs"), extra_env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,  # Phoenix takes OTLP/HTTP on its UI port, at /v1/traces
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    })
    try:
        async with aiohttp.ClientSession() as http:
            async def healthy() -> bool:
                if phoenix.poll() is not None:
                    raise AssertionError(f"phoenix exited with {phoenix.returncode}; see {tmp_path / 'phoenix.log'}")
                try:
                    async with http.get(f"{url}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await until(healthy, timeout_s=120, poll_s=0.25, what="phoenix to serve")
            await fleet.start()
            trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
            body = {"model": "tokenyard-sim", "prompt": "find my trace", "max_tokens": 3}
            headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
            async with http.post(f"{fleet.http_url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["finish_reason"] == "length"

            async def trace_spans() -> list[dict] | None:
                async with http.get(f"{url}/v1/projects/default/spans",
                                    params={"trace_id": trace_id, "limit": "100"}) as r:
                    if r.status != 200:
                        return None
                    spans = (await r.json())["data"]
                services = {s["attributes"].get("tokenyard.service") for s in spans}
                return spans if services >= HOPS and len(spans) >= 7 else None

            spans = await until(trace_spans, timeout_s=60, poll_s=0.25, what="every hop's span in Phoenix")
    finally:
        await fleet.stop()
        phoenix.terminate()
        phoenix.wait(30)
        log.close()

    assert {s["context"]["trace_id"] for s in spans} == {trace_id}  # one trace for the request
    by_name = {s["name"]: s for s in spans}
    assert {"process llm.v1.submit", "process llm.v1.queue", "process llm.v1.route"} <= set(by_name)
    worker = next(s for s in spans if s["attributes"].get("tokenyard.service") == "worker")
    assert worker["attributes"]["gen_ai.usage.output_tokens"] == 3
    router = by_name["process llm.v1.route"]["attributes"]
    assert router["tokenyard.router.policy"] == DEFAULT_POLICY
    assert router["tokenyard.router.instance"] in ("w0", "w1")
    for key in ("p_tokens", "batch_size", "hit_tokens", "score", "candidates"):
        assert f"tokenyard.router.{key}" in router
    assert router["tokenyard.outcome"] == "routed"
    # Every span but the edge's has its parent in the same trace.
    ids = {s["context"]["span_id"] for s in spans}
    roots = [s for s in spans if s.get("parent_id") not in ids]
    assert len(roots) == 1 and roots[0]["attributes"]["tokenyard.service"] == "edge"
