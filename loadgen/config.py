"""What one `bench serve` run is: target, workload, arrival process and SLOs, in one dataclass
that the CLI, the fleet launcher (`tokenyard up --bench-prompts N`) and bench/ scripts all
build. Parsing of the compound options (`--priority-mix a,b,c,d`, `--goodput ttft:MS …`,
`--tpot-slo-mix MS:FRACTION,…`) lives here too, so every caller validates the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tokenyard.shared import config as shared_config

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PRIORITY_MIX = (0.0, 1.0, 0.0, 0.0)
"""All requests P1 (online), the class of an ordinary API call."""


@dataclass
class BenchConfig:
    target: str = field(default_factory=shared_config.nats_url_from_env)
    """`nats://HOST:PORT` (TokenyardClient on llm.v1.submit) or `http://HOST:PORT` (the edge)."""
    model: str = shared_config.DEFAULT_MODEL
    workload: str = "synthetic"
    """A name of the workload registry (loadgen.workloads.WORKLOADS) or `trace:PATH`."""
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    """Lengths are uniform integers in [len·(1−r), len·(1+r)] (vllm's random dataset)."""
    rate: float = math.inf
    """Offered requests per second; inf sends every request at once."""
    burstiness: float = 1.0
    """Gamma shape of the inter-arrival gaps: 1 = Poisson, < 1 burstier, > 1 more regular."""
    concurrency: int | None = None
    """Cap on requests in flight; None = no cap."""
    priority_mix: tuple[float, float, float, float] = DEFAULT_PRIORITY_MIX
    """Fractions of P0..P3 (normalised)."""
    goodput: dict[str, float] = field(default_factory=dict)
    """SLOs in ms by metric (`ttft`, `tpot`, `e2el`); a request is good if it meets all (its
    own `tpot_slo_ms` in place of `tpot` where it sent one)."""
    tpot_slo_mix: tuple[tuple[float, float], ...] = ()
    """(TPOT SLO ms, fraction) pairs: each request sends a `tpot_slo_ms` drawn from them
    (seeded, loadgen.workload.with_tpot_slos); empty: requests send none."""
    seed: int = 0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    """How long to try reaching a NATS target before giving up on the run."""
    progress: bool = True
    """Show a rich progress bar on stderr."""
    tenant: str | None = None
    plots_dir: str | None = None
    """Write the run's figures here (loadgen/plots.py)."""
    fleet_nats: str | None = None
    """Where to read the workers' heartbeats for the per-worker plot; None: the target if NATS."""
    per_request: bool = False
    """Also return each request's own figures (`requests`: index, prompt tokens, TTFT ms or
    None, error), for pairing the same seeded request across runs (bench/live_router.py)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""
        if self.num_prompts < 0:
            raise ValueError("--num-prompts must be >= 0")
        if self.input_len < 1:
            raise ValueError("--input-len must be >= 1")
        if self.output_len < 1:
            raise ValueError("--output-len must be >= 1")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError("--range-ratio must be in [0, 1)")
        if not self.rate > 0:
            raise ValueError("--rate must be > 0 (inf sends everything at once)")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError("--burstiness must be a positive number")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        if not self.request_timeout_s > 0:
            raise ValueError("--request-timeout must be > 0")
        check_priority_mix(self.priority_mix)
        check_tpot_slo_mix(self.tpot_slo_mix)
        for key, value in self.goodput.items():
            if key not in GOODPUT_METRICS or not value >= 0:
                raise ValueError(f"bad goodput SLO {key}:{value}")
        if not self.target.startswith(("nats://", "tls://", "http://", "https://")):
            raise ValueError(f"--target must start with nats:// or http:// (got {self.target!r})")

    def describe(self) -> dict[str, Any]:
        """The run's settings as they go into the result JSON (`inf` as a string, as vllm)."""
        return {
            "target": self.target,
            "model": self.model,
            "workload": self.workload,
            "num_prompts": self.num_prompts,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "range_ratio": self.range_ratio,
            "rate": "inf" if math.isinf(self.rate) else self.rate,
            "burstiness": self.burstiness,
            "concurrency": self.concurrency,
            "priority_mix": list(self.priority_mix),
            "goodput_slos_ms": dict(self.goodput),
            "tpot_slo_mix": [list(pair) for pair in self.tpot_slo_mix],
            "seed": self.seed,
            "request_timeout_s": self.request_timeout_s,
        }


def check_priority_mix(mix: tuple[float, ...]) -> None:
    if len(mix) != 4 or any(not (x >= 0 and math.isfinite(x)) for x in mix) or sum(mix) <= 0:
        raise ValueError(
            "--priority-mix takes four non-negative fractions a,b,c,d (P0..P3) with a positive sum"
        )


def parse_priority_mix(text: str) -> tuple[float, float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--priority-mix: not numbers: {text!r}") from None
    check_priority_mix(parts)
    return parts  # type: ignore[return-value]


def check_tpot_slo_mix(mix: tuple[tuple[float, float], ...]) -> None:
    slos = [ms for ms, _ in mix]
    if any(not (0 < ms < math.inf) for ms in slos) or len(set(slos)) != len(slos):
        raise ValueError("--tpot-slo-mix: each TPOT SLO must be a distinct positive number of ms")
    if mix and (any(not (0 <= f < math.inf) for _, f in mix) or sum(f for _, f in mix) <= 0):
        raise ValueError("--tpot-slo-mix: fractions must be non-negative with a positive sum")


def parse_tpot_slo_mix(text: str | None) -> tuple[tuple[float, float], ...]:
    """`"50:0.5,200:0.5"` → `((50.0, 0.5), (200.0, 0.5))`: TPOT SLOs in ms with their shares
    (normalised when drawn); None or "" → no per-request TPOT SLO."""
    if not text:
        return ()
    pairs = []
    for item in text.split(","):
        ms, sep, share = item.partition(":")
        try:
            if not sep:
                raise ValueError
            pairs.append((float(ms), float(share)))
        except ValueError:
            raise ValueError(f"--tpot-slo-mix takes MS:FRACTION,… (got {item!r})") from None
    mix = tuple(pairs)
    check_tpot_slo_mix(mix)
    return mix


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` → `{"ttft": 500.0, "tpot": 50.0}` (vllm's --goodput)."""
    out: dict[str, float] = {}
    for item in items or []:
        key, sep, value = item.partition(":")
        if not sep or key not in GOODPUT_METRICS:
            raise ValueError(
                f"--goodput takes KEY:MS with KEY one of {', '.join(GOODPUT_METRICS)} (got {item!r})"
            )
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {key}: {value!r} is not a number") from None
        if not ms >= 0:
            raise ValueError(f"--goodput {key} must be >= 0")
        out[key] = ms
    return out
