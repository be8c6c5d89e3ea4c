"""`tokenyard worker --nats URL --engine sim [--profile P] [--speed X] [--id ID] [--model NAME]`
`tokenyard worker --nats URL --engine vllm --model PATH [vLLM settings]`

With `--engine vllm`, `--model` is the model's local path and, as with `vllm serve`, also the
name the fleet routes on unless `--served-model-name` says otherwise; output text is decoded
with the model's own tokenizer.json unless `--tokenizer` names another.
"""

from __future__ import annotations

import uuid

from tokenyard.shared import config


def register(sub) -> None:
    from tokenyard.services.worker.sim.engine_policies import ENGINE_POLICIES
    from tokenyard.services.worker.sim.latency import PROFILES

    p = sub.add_parser("worker", help="host an engine (simulated or vLLM) as a fleet member")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim", help="sim: the simulated engine; vllm: vLLM in-process")
    p.add_argument("--profile", choices=sorted(PROFILES), default="a100-llama3-8b",
                   help="sim: the GPU and model it behaves like")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--http", type=int, metavar="PORT",
                   help="also serve OpenAI /v1/completions, /v1/chat/completions, /v1/models, /health and "
                        "/metrics from this engine, like `vllm serve` (0: any free port)")
    p.add_argument("--http-host", default="127.0.0.1", help="address of the --http front")
    p.add_argument("--id", dest="worker_id", help="worker id (default: a random one)")
    p.add_argument("--model", default=None,
                   help=f"sim: the model name it serves (default {config.DEFAULT_MODEL}); vllm: the model's path")
    p.add_argument("--tokenizer", help="tokenizer.json for output text (default: the model's with vllm, "
                                       "else the built-in byte tokenizer)")
    p.add_argument("--num-blocks", type=int, help="sim: KV blocks (default: the profile's)")
    p.add_argument("--scheduling", choices=ENGINE_POLICIES, default="vllm",
                   help="sim: the engine's scheduling policy (default vllm: vLLM V1's; scorpio: SCORPIO's "
                        "TPOT-SLO batching, which rejects a request it held past its TTFT deadline)")
    p.add_argument("--flow-control", choices=("on", "off"), default="on",
                   help="refuse new requests while the prefill backlog exceeds the queue's horizon "
                        "(default: on; off with `tokenyard queue --flow-control off`)")
    p.add_argument("--block-size", type=int, default=None,
                   help=f"sim: KV block size (default {config.BLOCK_SIZE}); vllm: vLLM's KV block size "
                        "(default: the platform's, 128 on CPU, where it must be a multiple of 32)")
    v = p.add_argument_group("vLLM engine (--engine vllm)")
    v.add_argument("--served-model-name", help="the name the fleet routes on (default: --model)")
    v.add_argument("--dtype", default="auto", help="weights/activations dtype: auto, float16, bfloat16, float32")
    v.add_argument("--kv-cache-dtype", default="auto", help="auto, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2")
    v.add_argument("--quantization", help="weight quantization, e.g. fp8_per_block, fp8_per_channel, awq")
    v.add_argument("--kv-offload-gb", type=float, default=0.0,
                   help="host-memory KV tier through vLLM's offloading connector (CUDA/ROCm/XPU only)")
    v.add_argument("--preemption-mode", choices=("recompute", "swap", "auto"), default="recompute",
                   help="swap = keep a preempted request's KV in the offload tier (needs --kv-offload-gb); "
                        "auto (sim only) = swap when it costs under 0.3 x the recompute")
    v.add_argument("--max-num-seqs", type=int, help="running batch cap")
    v.add_argument("--max-num-batched-tokens", type=int, help="per-step token budget")
    v.add_argument("--long-prefill-token-threshold", type=int, metavar="N",
                   help="most prompt tokens one request prefills in a step while others are in the engine, "
                        "so short prompts start beside a long one (default 0: no cap, as vLLM; both engines)")
    v.add_argument("--max-model-len", type=int, help="default: the model's")
    v.add_argument("--kv-cache-memory-gb", type=float, help="KV cache size (default: vLLM's for the platform)")
    v.add_argument("--gpu-memory-utilization", type=float, help="share of GPU memory vLLM may use (default: vLLM's, 0.9)")
    v.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs (faster start)")
    v.add_argument("--scheduler-cls", help="module.Class, a subclass of vLLM's V1 Scheduler (engine-side policy)")
    v.add_argument("--seed", type=int, default=0, help="sampling seed")
    v.add_argument("--stream-interval", type=int, default=1,
                   help="tokens per chunk after the first (1: token by token; more saves host CPU)")
    v.add_argument("--fleet-block-size", type=int, default=config.BLOCK_SIZE,
                   help="block size of the fleet's hash chain that KV events are relayed in")
    p.set_defaults(func=main)


def vllm_settings(args):
    from tokenyard.services.worker.vllm.settings import VllmSettings

    if not args.model:
        raise SystemExit("tokenyard worker --engine vllm needs --model PATH")
    return VllmSettings(
        model=args.model, served_model_name=args.served_model_name, dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization, kv_offload_gb=args.kv_offload_gb,
        preemption_mode=args.preemption_mode, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold or 0, block_size=args.block_size,
        enforce_eager=args.enforce_eager, max_model_len=args.max_model_len,
        kv_cache_memory_gb=args.kv_cache_memory_gb, gpu_memory_utilization=args.gpu_memory_utilization,
        scheduler_cls=args.scheduler_cls, seed=args.seed, stream_interval=args.stream_interval,
        fleet_block_size=args.fleet_block_size,
    )


def build(args):
    from tokenyard.services.worker.core import WorkerConfig
    from tokenyard.services.worker.shell import WorkerShell
    from tokenyard.shared.tokenizer import HFTokenizer, load_tokenizer

    worker_id = args.worker_id or f"w-{uuid.uuid4().hex[:8]}"
    if args.engine == "vllm":
        try:
            from tokenyard.services.worker.vllm.engine import VllmEngine, platform_name
        except ModuleNotFoundError as e:
            if e.name not in ("vllm", "zmq"):
                raise
            raise SystemExit(
                "tokenyard worker --engine vllm needs vLLM: bash deploy/bootstrap.sh test,vllm "
                "(vLLM's CPU build), or pip install -e '.[vllm-cuda]' on a GPU host"
            ) from None
        from tokenyard.services.worker.vllm.settings import engine_kwargs

        settings = vllm_settings(args)
        engine_kwargs(settings, platform_name(), "ipc://check")  # refuse now, not after the engine starts
        engine = VllmEngine(settings)
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else HFTokenizer(settings.model)
        shell = WorkerShell(WorkerConfig(worker_id=worker_id, model=settings.name, engine="vllm",
                                         flow_control=args.flow_control == "on"), engine, tokenizer)
        return _with_http(args, shell, settings.fleet_block_size)

    from tokenyard.services.worker.sim.engine import SimEngine
    from tokenyard.services.worker.sim.latency import profile
    from tokenyard.services.worker.sim.settings import sim_core

    block_size = args.block_size or config.BLOCK_SIZE
    engine = SimEngine(sim_core(profile(args.profile), block_size, args), speed=args.speed)
    cfg = WorkerConfig(worker_id=worker_id, model=args.model or config.DEFAULT_MODEL, engine="sim",
                       flow_control=args.flow_control == "on")
    return _with_http(args, WorkerShell(cfg, engine, load_tokenizer(args.tokenizer)), block_size)


def _with_http(args, shell, block_size: int):
    """The worker's own OpenAI front (--http PORT), beside its NATS endpoints."""
    if args.http is None:
        return shell
    from tokenyard.services.worker.http import HttpFrontConfig, WithHttpFront, WorkerHttp

    cfg = HttpFrontConfig(port=args.http, host=args.http_host, model=shell.core.cfg.model, block_size=block_size)
    return WithHttpFront(shell, WorkerHttp(shell.engine, shell.core.tokenizer, cfg))


def main(args) -> int:
    from tokenyard.shared.service import run

    try:
        shell = build(args)
    except ValueError as e:  # a setting the engine cannot honour (vLLM's SettingsError is one)
        raise SystemExit(f"tokenyard worker: {e}") from None
    if args.engine != "vllm":
        run(shell, args.nats, args.metrics_port)
        return 0
    _serve_vllm(shell, args.nats)
    return 0


def _serve_vllm(shell, nats_url: str) -> None:
    """As shared.service.run, with the engine started first: vLLM takes seconds to start,
    and the worker must not answer `$SRV.PING` (the launcher's readiness) or take requests
    before it can serve them; an engine that fails to start exits the process unregistered.
    (WorkerShell.start starting it again is a no-op.)"""
    import asyncio

    from tokenyard.shared.service import ServiceHost

    engine = (shell.shell if hasattr(shell, "shell") else shell).engine  # WithHttpFront wraps the shell

    async def serve() -> None:
        await engine.start()
        try:
            await ServiceHost(shell, nats_url).run_until_signalled()
        finally:
            await engine.stop()

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve())
