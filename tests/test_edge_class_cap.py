"""Over real HTTP, the edge and admission on a real nats-server: a prompt whose own prefill
cannot fit its class's deadline cap (shared.slo.deadline_cap_s) even on an idle fleet is a 400
`slo_infeasible` in OpenAI's error body, naming its predicted prefill, the class's target and
what to do (that doing it is admitted: tests/test_admission_class_cap.py), counted in
Prometheus as reason `beyond_class_cap`."""

from __future__ import annotations

import time

import aiohttp
from tokenyard.services.admission.core import AdmissionConfig
from tokenyard.services.admission.shell import AdmissionShell
from tokenyard.services.edge.shell import EdgeConfig, EdgeShell
from tokenyard.shared import codec, config, natsutil, subjects
from tokenyard.shared.service import ServiceHost
from tokenyard.shared.tokenizer import ByteTokenizer

from tests import builders
from tests.conftest import stop_hosts, until

SLOW = 5.0
"""ms per prompt token the fake worker reports: 2000 tokens take 10 s, beyond P1's 8.7 s cap."""


async def test_a_prompt_beyond_its_class_cap_is_a_400_over_http_that_says_what_to_do(nats_server):
    nc = await natsutil.connect(nats_server.url, "test-class-cap")
    hosts = []
    try:
        admission = await ServiceHost(AdmissionShell(AdmissionConfig(), ByteTokenizer()), nats_server.url).start()
        hosts.append(admission)
        edge = await ServiceHost(EdgeShell(EdgeConfig(http_port=0, models=[config.DEFAULT_MODEL])),
                                 nats_server.url).start()
        hosts.append(edge)

        async def beat() -> bool:  # a fresh, slow worker: admission now predicts the prompt's prefill
            hb = builders.hb("w-slow", model=config.DEFAULT_MODEL, ts=time.time(), interval_s=60.0,
                             prefill_ms_per_token=SLOW)
            await nc.publish(subjects.heartbeat("w-slow"), codec.encode(hb))
            return "w-slow" in admission.shell.core.fleet.prefill_cost

        await until(beat, timeout_s=30, poll_s=0.05, what="admission to hear the worker's prefill cost")
        url = f"http://127.0.0.1:{edge.shell.port}/v1/completions"
        body = {"model": config.DEFAULT_MODEL, "prompt": "a" * 2000, "max_tokens": 4}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body) as r:
                status, doc, headers = r.status, await r.json(), r.headers
            assert status == 400 and "Retry-After" not in headers
            err = doc["error"]
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "slo_infeasible", "prompt")
            assert err["message"].startswith("The 2000-token prompt takes about 10.0 s to prefill, beyond what a "
                                             "P1 request may take before its first token (8.7 s at most, from its "
                                             "5 s TTFT target)")
            assert err["message"].endswith("(x-request-tier: P2) or with ttft_slo_ms of at least 10300")
        # Prometheus counts it apart from a client's too-tight ttft_slo_ms (the error code stays slo_infeasible)
        get = admission.shell.metrics.registry.get_sample_value
        await until(lambda: get("tokenyard:refusals_total", {"reason": "beyond_class_cap"}) == 1.0,
                    what="the refusal counted as beyond_class_cap")
        assert get("tokenyard:refusals_total", {"reason": "slo_infeasible"}) is None
    finally:
        await stop_hosts(hosts)
        await nc.drain()
