"""`tokenyard admission --nats URL [--model NAME …] [--tokenizer PATH] [--tenants FILE.toml]
[--global-rate TOKENS_PER_S] [--no-slo-check]` (tenant file format: services/admission/tenants.py).

The same options serve `tokenyard queue --with-admission`, admission in the queue's process
(`add_admission_arguments`, `admission_shell`)."""

from __future__ import annotations

from tokenyard.shared import config


def register(sub) -> None:
    p = sub.add_parser("admission", help="validate, tokenize and enqueue requests")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    add_admission_arguments(p)
    p.set_defaults(func=main)


def add_admission_arguments(p) -> None:
    """Admission's own options (also those of `tokenyard queue --with-admission`)."""
    p.add_argument("--model", action="append", help="served model name (repeatable)")
    p.add_argument("--tokenizer", help="path of a tokenizer.json (default: the built-in byte tokenizer)")
    p.add_argument("--max-model-len", type=int, default=config.MAX_MODEL_LEN, help="longest prompt + output accepted, in tokens")
    p.add_argument("--block-size", type=int, default=config.BLOCK_SIZE, help="tokens per block of the prompt's hash chain (the engines' KV block size)")
    p.add_argument("--tenants", help="TOML file of tenant policies, API keys and rates")
    p.add_argument("--global-rate", type=float, help="fleet-wide token bucket rate, tokens/s (prompt + max_tokens)")
    p.add_argument("--global-burst", type=float, help="fleet-wide bucket capacity (default 2 × rate)")
    p.add_argument("--no-slo-check", action="store_true", help="admit whatever the predicted wait")


def admission_shell(args, queue=None, feeds=None):
    """The AdmissionShell the options parsed by `add_admission_arguments` ask for; `queue`: a
    queue in this process, handed each admitted request at once; `feeds`: the fan-out
    subscriptions it shares with the services in its process (shared/feed.py)."""
    import tomllib

    from tokenyard.services.admission.core import AdmissionConfig
    from tokenyard.services.admission.shell import AdmissionShell
    from tokenyard.services.admission.tenants import TenantTable, load_tenants
    from tokenyard.shared.tokenizer import load_tokenizer

    if args.tenants:
        with open(args.tenants, "rb") as f:
            table = load_tenants(tomllib.load(f))
    else:
        table = AdmissionConfig().table() if args.global_rate else None
    if args.global_rate:
        table = table or TenantTable()
        table.global_rate_tokens_per_s = args.global_rate
        table.global_burst_tokens = args.global_burst or 2 * args.global_rate
    cfg = AdmissionConfig(
        models=args.model or [config.DEFAULT_MODEL], max_model_len=args.max_model_len, block_size=args.block_size,
        tenants=table, slo_check=not args.no_slo_check,
    )
    return AdmissionShell(cfg, load_tokenizer(args.tokenizer), queue=queue, feeds=feeds)


def main(args) -> int:
    from tokenyard.shared.service import run

    run(admission_shell(args), args.nats, args.metrics_port)
    return 0
