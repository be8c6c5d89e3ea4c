"""`tokenyard admission --nats URL [--model NAME …] [--tokenizer PATH]`."""

from __future__ import annotations

from shared import config


def register(sub) -> None:
    p = sub.add_parser("admission", help="validate, tokenize and enqueue requests")
    p.add_argument("--nats", default=config.nats_url_from_env())
    p.add_argument("--model", action="append", help="served model name (repeatable)")
    p.add_argument("--tokenizer", help="path of a tokenizer.json (default: the built-in byte tokenizer)")
    p.add_argument("--max-model-len", type=int, default=config.MAX_MODEL_LEN)
    p.add_argument("--block-size", type=int, default=config.BLOCK_SIZE)
    p.set_defaults(func=main)


def main(args) -> int:
    from services.admission.core import AdmissionConfig
    from services.admission.shell import AdmissionShell
    from shared.service import run
    from shared.tokenizer import load_tokenizer

    cfg = AdmissionConfig(
        models=args.model or [config.DEFAULT_MODEL], max_model_len=args.max_model_len, block_size=args.block_size
    )
    run(AdmissionShell(cfg, load_tokenizer(args.tokenizer)), args.nats)
    return 0
