"""`tokenyard worker --nats URL --engine sim [--profile P] [--speed X] [--id ID] [--model NAME]`."""

from __future__ import annotations

import uuid

from shared import config


def register(sub) -> None:
    from services.worker.sim.latency import PROFILES

    p = sub.add_parser("worker", help="host an engine (simulated or vLLM) as a fleet member")
    p.add_argument("--nats", default=config.nats_url_from_env())
    p.add_argument("--engine", choices=("sim",), default="sim", help="vllm arrives with issue 4")
    p.add_argument("--profile", choices=sorted(PROFILES), default="a100-llama3-8b")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--id", dest="worker_id", help="worker id (default: a random one)")
    p.add_argument("--model", default=config.DEFAULT_MODEL, help="the model name it serves")
    p.add_argument("--tokenizer", help="tokenizer.json for output text (default: built-in byte tokenizer)")
    p.add_argument("--num-blocks", type=int, help="KV blocks (default: the profile's)")
    p.add_argument("--block-size", type=int, default=config.BLOCK_SIZE)
    p.set_defaults(func=main)


def build(args):
    from services.worker.core import WorkerConfig
    from services.worker.shell import WorkerShell
    from services.worker.sim.core import SimEngineCore
    from services.worker.sim.engine import SimEngine
    from services.worker.sim.latency import profile
    from shared.tokenizer import load_tokenizer

    engine = SimEngine(SimEngineCore(profile(args.profile), args.block_size, args.num_blocks), speed=args.speed)
    cfg = WorkerConfig(worker_id=args.worker_id or f"w-{uuid.uuid4().hex[:8]}", model=args.model, engine="sim")
    return WorkerShell(cfg, engine, load_tokenizer(args.tokenizer))


def main(args) -> int:
    from shared.service import run

    run(build(args), args.nats)
    return 0
