"""The vLLM engine behind a tokenyard worker (`tokenyard worker --engine vllm --model PATH`).

    settings.py   tokenyard's worker settings → vLLM's AsyncEngineArgs (pure; refusals named)
    kv_relay.py   vLLM block hashes → the fleet's chain hashes (pure)
    stats.py      vLLM's per-step SchedulerStats → EngineStats (pure)
    engine.py     VllmEngine: AsyncLLM in-process, the `Engine` protocol (imports vllm)

Only engine.py imports vllm (the `vllm` extra); the rest is plain Python, tested without it.
"""
