"""What a cluster simulation runs: the fleet (instances, latency profile, macro-instances,
mode), the live services' settings it mirrors (router policy, queue policy, flow control,
deadlines, admission's SLO check) and the simulator's own cadences (heartbeat, keep-alive,
samples). The defaults are the live fleet's: a simulation without options runs what
`tokenyard up` runs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tokenyard.services.priority_queue.policies.registry import DEFAULT_POLICY as DEFAULT_QUEUE_POLICY
from tokenyard.services.router.core import RouterConfig
from tokenyard.shared.ecoserve import EcoConfig

MODEL = "tokenyard-sim"
"""The model every simulated worker serves and every simulated request asks for."""


@dataclass
class SimConfig:
    instances: int = 16
    profile: str = "a100-llama3-8b"
    policy: str = RouterConfig.policy
    """The router's declared default, as `tokenyard router` runs it."""
    queue_policy: str = DEFAULT_QUEUE_POLICY
    flow_control: bool = True
    """Flow control, on as live: the queue's (QueueConfig.flow_control) and the workers' refusal
    while saturated (WorkerConfig.flow_control)."""
    deadline_reject: bool = True
    """The queue rejects a request that can no longer meet its TTFT deadline (QueueConfig.expire_deadlines)."""
    slo_check: bool = True
    """Admission refuses a request whose predicted wait breaks its target (AdmissionConfig.slo_check)."""
    macro_size: int | None = None
    """None: no macro-instance controller (every worker accepts, as a plain fleet)."""
    mode: str = "nodg"
    heartbeat_s: float = 0.1
    keepalive_s: float = 0.5
    sample_s: float = 1.0
    """Batch sizes and P×BS are sampled this often (load-balance metrics, plots)."""
    slots_per_worker: int = 64
    max_model_len: int = 131_072
    """Llama-3.1-8B's context: Mooncake prompts reach 126k tokens."""
    seed: int = 0
    """The router's RNG seed (a softmax picker draws from it)."""
    router_options: dict = field(default_factory=dict)
    """Extra RouterConfig fields (policy knobs), passed as they are."""
    macro_options: dict = field(default_factory=dict)
    """Extra MacroConfig fields (EcoServe's `rolling` rules, `scaling`), as they are; the
    rolling rules' SLOs are replaced by the two below."""
    chunked_prefill: bool = True
    """False: every engine runs vLLM without chunked prefill (whole prompts, or decodes)."""
    prefill_only_phases: bool = False
    """EcoServe: a worker's prefill phase prefills only (seed 002 §2.2.1), instead of mixing
    its decodes into the chunks."""
    pd_prefill: int | None = None
    """Mode `pd`: prefill workers per macro-instance (MacroConfig.pd_prefill)."""
    mitosis: bool = False
    """Mitosis scaling acted on: the controller grows, splits, shrinks and merges the
    macro-instances (seed's windows and thresholds, N_upper = the macro size, N_lower = half
    of it) and the simulator starts and stops workers as it says."""
    provision_delay_s: float = 30.0
    """Mitosis: a worker the controller asks for heartbeats this long after (the vLLM
    worker's engine takes 20–50 s to start before it registers)."""
    fold_decodes: bool = True
    """Fold each engine's pure decode steps between the events that look at it (fold.py): the
    same results, fewer events. False: every step one by one (the reference it is tested against)."""
    fold_ticks: bool = True
    """With fold_decodes: fold across the 100 ms ticks where a tick reads an engine only
    through its stats (across.py). False: every fold ends at the next tick (the reference)."""
    quiet_ticks: bool = True
    """A tick that another follows before the next arrival, with the queue empty, nothing
    else queued and no macro-instance controller, sends no changed worker's heartbeat (tick.py,
    `silent`; a worker gone idle has its stats kept and sent by the next tick that is not
    silent): the next send supersedes it before any core reads one. Folds across ticks
    then stop only at the ticks that read an engine's stats. False: every tick sends them."""
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    """The SLOs the fleet runs to: EcoServe's constraint check and phase rules, and every
    engine's saved-slack clock. None: EcoConfig's defaults. `simulate` fills them from the
    goodput SLOs, so a run is held to the SLOs it is scored against (issue 13, fixes 1–2)."""

    long_prefill_token_threshold: int | None = None
    """Every engine's vLLM long_prefill_token_threshold (the most prompt tokens one request
    prefills in a step beside others; 0: no cap). None: the profile's (0 unless it sets one)."""

    def slos(self) -> tuple[float, float]:
        """(TTFT, TPOT) SLOs in ms, defaults filled in."""
        eco = EcoConfig()
        return (
            eco.ttft_slo_ms if self.ttft_slo_ms is None else self.ttft_slo_ms,
            eco.tpot_slo_ms if self.tpot_slo_ms is None else self.tpot_slo_ms,
        )


def with_slos(cfg: SimConfig, goodput_ms: dict[str, float] | None) -> SimConfig:
    """`cfg` with the goodput's TTFT/TPOT SLOs where `cfg` sets none."""
    g = goodput_ms or {}
    return replace(
        cfg,
        ttft_slo_ms=cfg.ttft_slo_ms if cfg.ttft_slo_ms is not None else g.get("ttft"),
        tpot_slo_ms=cfg.tpot_slo_ms if cfg.tpot_slo_ms is not None else g.get("tpot"),
    )
