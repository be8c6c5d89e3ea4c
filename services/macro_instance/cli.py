"""`tokenyard macro --nats URL [--macro-size K] [--mode nodg|ecoserve|pd] [--pd-prefill K] [--ttft-slo-ms T]
[--tpot-slo-ms T] [--scale --n-lower L --n-upper U --max-workers N --worker-profile P]`.

With `--scale`, mitosis scaling starts and stops `tokenyard worker` processes on this
machine (LocalProcessProvisioner); without it the fleet is what the heartbeats show."""

from __future__ import annotations

from tokenyard.shared import config


def register(sub) -> None:
    from tokenyard.services.macro_instance.core import MODES
    from tokenyard.shared.ecoserve import MIN_PHASE_S

    p = sub.add_parser("macro", help="group workers into macro-instances and set their phases")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    p.add_argument("--macro-size", type=int, default=4, help="workers per macro-instance")
    p.add_argument("--mode", choices=MODES, default="nodg",
                   help="nodg: every worker mixed; ecoserve: workers take turns at prefill; "
                        "pd: prefill and decode workers (spatial disaggregation)")
    p.add_argument("--pd-prefill", type=int, default=None, help="pd: prefill workers per macro-instance (default half)")
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0, help="EcoServe constraint check: TTFT SLO")
    p.add_argument("--tpot-slo-ms", type=float, default=100.0, help="EcoServe constraint check: TPOT SLO")
    p.add_argument("--min-phase-s", type=float, default=MIN_PHASE_S,
                   help="EcoServe: shortest prefill or decode phase (default: %(default)s)")
    p.add_argument("--stagger-s", type=float, default=1.0, help="EcoServe: interval between two activations")
    p.add_argument("--scale", action="store_true", help="mitosis scaling with local worker processes")
    p.add_argument("--n-lower", type=int, default=None,
                   help="with --scale: a split makes a macro-instance of this many workers, one shrunk to it merges "
                        "(default: half the macro size)")
    p.add_argument("--n-upper", type=int, default=None,
                   help="with --scale: a macro-instance above this many workers splits (default: the macro size)")
    p.add_argument("--max-workers", type=int, default=16, help="with --scale: most worker processes started")
    p.add_argument("--worker-engine", default="sim", help="with --scale: engine of the workers it starts")
    p.add_argument("--worker-profile", default="a100-llama3-8b", help="with --scale: their latency profile")
    p.add_argument("--worker-speed", type=float, default=1.0, help="with --scale: their simulated seconds per wall second")
    p.add_argument("--worker-model", default=config.DEFAULT_MODEL, help="with --scale: the model they serve")
    p.add_argument("--worker-scheduling", default="vllm",
                   help="with --scale: the simulated workers' scheduling policy (tokenyard worker --scheduling)")
    p.set_defaults(func=main)


def main(args) -> int:
    from tokenyard.services.macro_instance.core import MacroConfig
    from tokenyard.services.macro_instance.mitosis import mitosis_config
    from tokenyard.services.macro_instance.provisioner import LocalProcessProvisioner
    from tokenyard.services.macro_instance.rolling import RollingConfig
    from tokenyard.services.macro_instance.shell import MacroShell
    from tokenyard.shared.ecoserve import EcoConfig
    from tokenyard.shared.service import run

    eco = EcoConfig(ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms)
    cfg = MacroConfig(size=args.macro_size, mode=args.mode, pd_prefill=args.pd_prefill,
                      rolling=RollingConfig(eco, min_phase_s=args.min_phase_s, stagger_s=args.stagger_s))
    provisioner = None
    if args.scale:
        bounds = {k: v for k, v in (("n_lower", args.n_lower), ("n_upper", args.n_upper)) if v is not None}
        cfg.scaling = mitosis_config(args.macro_size, max_workers=args.max_workers, **bounds)
        provisioner = LocalProcessProvisioner(args.nats, args.worker_engine, args.worker_profile, args.worker_speed,
                                              args.worker_model, args.worker_scheduling)
    run(MacroShell(cfg, provisioner=provisioner), args.nats, args.metrics_port)
    return 0
