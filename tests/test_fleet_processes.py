"""The fleet as `tokenyard up` runs it: every service its own OS process on a real
nats-server, discovered through `$SRV.PING`, one request over NATS and one over HTTP, then a
clean stop (every process drains and exits 0)."""

from __future__ import annotations

import json

import aiohttp
from tokenyard.shared import natsutil, schemas
from tokenyard.shared.client import TokenyardClient

from tokenyard.launcher import FleetProcesses, ping


async def test_fleet_of_processes_serves_nats_and_http(tmp_path):
    fleet = FleetProcesses(workers=2, profile="zero", http_port=0, log_dir=str(tmp_path))
    await fleet.start()
    procs = list(fleet.procs)
    try:
        nc = await natsutil.connect(fleet.nats_url, "test")
        assert await ping(nc) == fleet.expected()

        done = await TokenyardClient(nc).generate(schemas.GenerateRequest(prompt="over nats", max_tokens=4))
        assert done.finish_reason == "length" and done.usage.completion_tokens == 4
        assert done.worker_id in ("w0", "w1")
        await nc.drain()

        async with aiohttp.ClientSession() as http:
            body = {"model": "tokenyard-sim", "prompt": "over http", "max_tokens": 3, "stream": True}
            async with http.post(f"{fleet.http_url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                lines = [ln.decode().strip() async for ln in resp.content if ln.strip()]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) != ""
    finally:
        await fleet.stop()
    assert {name: p.returncode for name, p in procs} == {name: 0 for name, _ in procs}
