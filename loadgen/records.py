"""What the load generator observes of one request: timestamps (time.perf_counter seconds)
and counts, filled in by a target, read by the metrics. Derived latencies follow
vllm bench serve's backend functions:

    ttft = first chunk − send
    itl  = gaps between consecutive chunks (one entry per chunk after the first)
    e2el = last chunk − send     (vllm's `latency`: the terminal event itself is not a token)
    tpot = (e2el − ttft) / (output_tokens − 1)   only when output_tokens > 1

A request succeeded when no failure was recorded and at least one chunk arrived (vllm
marks a stream with no chunk failed: it has no TTFT).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_OUTPUT = "no_output"
TIMEOUT = "timeout"


@dataclass(slots=True)
class RequestRecord:
    index: int
    priority: int
    """The declared class the workload sent (0..3)."""
    prompt_len: int
    """The workload's own count of prompt tokens."""
    tpot_slo_ms: float | None = None
    """The TPOT SLO the request sent (`--tpot-slo-mix`); None: it sent none."""
    scheduled_s: float = 0.0
    """When the arrival process wanted it sent."""
    dispatched_s: float = 0.0
    """When the pacing loop started it (scheduled + the generator's own lag)."""
    send_s: float = 0.0
    """When it went on the wire (after waiting for a concurrency slot, as vllm)."""
    accepted_s: float | None = None
    """NATS only: when the client had the acceptance: admission's Accepted, or the first chunk carrying it."""
    chunk_s: list[float] = field(default_factory=list)
    """Arrival time of every token chunk, the first included."""
    end_s: float | None = None
    """When the stream ended (Finished / [DONE] / failure)."""
    streamed_tokens: int = 0
    """Tokens counted off the stream (token ids on NATS, chunks over HTTP)."""
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    """Failure reason, a short label (`status_429`, `timeout`, …) used as a counter key."""
    message: str = ""
    """The failure's human-readable detail (first one only)."""

    def fail(self, reason: str, message: str = "") -> None:
        if self.error is None:
            self.error, self.message = reason, message

    def close(self, now: float) -> None:
        """Called once the request is over, whatever happened."""
        if self.end_s is None:
            self.end_s = now
        if self.error is None and not self.chunk_s:
            self.fail(NO_OUTPUT, "the stream ended without a token chunk")

    @property
    def success(self) -> bool:
        return self.error is None and bool(self.chunk_s)

    @property
    def output_tokens(self) -> int:
        """From the server's usage when it sent one, else counted off the stream."""
        return (
            self.usage_completion_tokens if self.usage_completion_tokens is not None else self.streamed_tokens
        )

    @property
    def prompt_tokens(self) -> int:
        """From the server's usage when it sent one (its tokenizer is the truth), else the workload's count."""
        return self.usage_prompt_tokens if self.usage_prompt_tokens is not None else self.prompt_len

    @property
    def ttft(self) -> float:
        return self.chunk_s[0] - self.send_s

    @property
    def e2el(self) -> float:
        return self.chunk_s[-1] - self.send_s

    @property
    def itl(self) -> list[float]:
        c = self.chunk_s
        return [c[i] - c[i - 1] for i in range(1, len(c))]

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        return (self.e2el - self.ttft) / (n - 1) if n > 1 else None
