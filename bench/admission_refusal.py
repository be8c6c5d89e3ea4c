"""How long admission's core takes to refuse (and, for scale, to admit) one request.

    python -m bench.admission_refusal [--n 20000]

Times AdmissionCore.admit in-process (no NATS) for: a 503 from SLO feasibility (the queue
state says P1 would wait 8 s), a 429 from the tenant's token bucket, and an admitted
request with a 1,000-character prompt (tokenized and hashed). Median and p99 in µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.admission.tenants import TenantPolicy, TenantTable
from tokenyard.shared.schemas import GenerateRequest, QueueStats
from tokenyard.shared.tokenizer import ByteTokenizer


def timed(fn, n: int) -> tuple[float, float]:
    out = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t) / 1000)
    out.sort()
    return statistics.median(out), out[int(0.99 * (n - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.admission_refusal")
    ap.add_argument("--n", type=int, default=20000, help="calls timed per case (default: %(default)s)")
    n = ap.parse_args(argv).n
    prompt = "x" * 1000
    saturated = AdmissionCore(AdmissionConfig(), ByteTokenizer())
    saturated.on_queue_stats(QueueStats("pq", 0.0, "hybrid", [0, 40, 0, 0], [0, 80_000, 0, 0], 0, 10_000.0), 0.0)
    limited = AdmissionCore(AdmissionConfig(tenants=TenantTable(default=TenantPolicy(rate_tokens_per_s=1.0,
                                                                                      burst_tokens=2000.0))),
                            ByteTokenizer())
    limited.admit(GenerateRequest(prompt=prompt, max_tokens=900), reply_to="r", json=False, headers=None, now=0.0,
                  new_id="warm")  # spends the bucket
    free = AdmissionCore(AdmissionConfig(slo_check=False), ByteTokenizer())
    req = GenerateRequest(prompt=prompt, max_tokens=100)
    cases = {
        "503 (SLO feasibility)": lambda i: saturated.admit(req, reply_to="r", json=False, headers=None, now=0.0,
                                                             new_id=f"a{i}"),
        "429 (tenant bucket)": lambda i: limited.admit(req, reply_to="r", json=False, headers=None, now=0.0,
                                                        new_id=f"b{i}"),
        "admitted (1,000-char prompt)": lambda i: free.admit(req, reply_to="r", json=False, headers=None, now=0.0,
                                                             new_id=f"c{i}"),
    }
    for name, fn in cases.items():
        p50, p99 = timed(fn, n)
        print(f"{name:32} p50 {p50:7.1f} µs   p99 {p99:7.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
