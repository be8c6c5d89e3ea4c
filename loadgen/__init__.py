"""tokenyard's load generator, `tokenyard bench serve` (shaped like `vllm bench serve`).

    workload ──BenchRequest (prompt, lengths, priority, arrival offset)──> serve (pacing, cap)
        ──> target (NATS client or HTTP /v1/completions SSE) ──RequestRecord──> metrics ──> report

Programmatic use: `await loadgen.serve.run_bench(BenchConfig(...))` returns the result dict
(vllm's key names); `loadgen.report.print_result(result)` prints it.
"""
