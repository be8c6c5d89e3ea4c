"""Every message tokenyard puts on NATS, as msgspec Structs (MessagePack on the wire, JSON on
request). New fields go only at the end, with defaults, so old readers keep working.

    client ──GenerateRequest──> admission ──AdmittedRequest──> queue ──(same)──> router
    router ──GenerateOrder──> worker ──GenerateReply──> router ──RouteDecision──> queue
    worker ──StreamEvent (Chunk… Finished)──> the request's reply subject
    worker ──Heartbeat──> llm.v1.hb.<id>        worker ──KVEventBatch──> llm.v1.kv.<id>
    macro  ──MacroState──> llm.v1.macro.<id>.state, WorkerControl ──> llm.v1.worker.<id>.control
    queue  ──QueueStats──> llm.v1.pq.state       admission ──FleetHealth──> an edge (shared/service_state.py)

KV events mirror vLLM's `vllm.distributed.kv_events` structs field for field (array-like,
tagged), so a vLLM worker's events decode here without translation.
"""

from __future__ import annotations

import enum
from typing import Any, NewType

import msgspec
from tokenyard.shared.in_transit import in_transit
from tokenyard.shared.ints import Int64
from tokenyard.shared.kv_events import (  # noqa: F401  (re-exported: every message is read as schemas.X)
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEvent,
    KVEventBatch,
)
from tokenyard.shared.service_state import FleetHealth, QueueStats  # noqa: F401  (re-exported, as above)

WorkerId = NewType("WorkerId", str)
MacroId = NewType("MacroId", str)
RequestId = NewType("RequestId", str)
BlockHash = NewType("BlockHash", int)
"""The fleet's block hash: tokenyard's own chain over token ids (shared.hashing), signed 64 bits."""



class PriorityClass(enum.IntEnum):
    """Service classes (docs/ARCHITECTURE.md §3); lower value runs first."""

    P0 = 0  # realtime, < 500 ms TTFT
    P1 = 1  # online, < 5 s
    P2 = 2  # batch, < 60 s
    P3 = 3  # background, no target


class Outcome(enum.StrEnum):
    """What happened to a request at a hop; doubles as a metric label."""

    ADMITTED = "admitted"
    REJECTED_INVALID = "rejected_invalid"
    REJECTED_RATE = "rejected_rate"
    REJECTED_CAPACITY = "rejected_capacity"
    QUEUED = "queued"
    ROUTED = "routed"
    NO_CAPACITY = "no_capacity"
    ABORTED = "aborted"
    FINISHED = "finished"
    FAILED = "failed"
    MIGRATED = "migrated"
    DUPLICATE = "duplicate"
    REJECTED_DEADLINE = "rejected_deadline"
    """The queue let a request go once it could no longer meet its TTFT deadline (429)."""
    ADMIT_FAILED = "admit_failed"
    """Admitted, but JetStream did not store it (unavailable or full): answered 503."""


class Phase(enum.StrEnum):
    MIXED = "mixed"  # NoDG: prefill and decode on the same worker
    PREFILL = "prefill"
    DECODE = "decode"


# ───────────────────────────── client request ─────────────────────────────


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | list[dict] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class VllmSampling(msgspec.Struct, omit_defaults=True):
    """Sampling vLLM applies beyond OpenAI's basics: OpenAI's two penalties and vLLM's extras,
    on the request as the client gives them and on `Sampling` as the worker gets them (ranges:
    shared.validation). None: the engine's default (no penalty, no top-k / min-p cut, no
    minimum). The simulated engine samples nothing: it runs every request to its max_tokens."""

    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    min_tokens: Int64 | None = None


class GenerateRequest(VllmSampling, omit_defaults=True):
    """What a client publishes on `llm.v1.submit`: the fields of OpenAI's completions / chat
    completions request, plus vLLM's `priority` (lower runs first) and tokenyard's own
    (`request_id`, `tenant`, and for trace replay `block_hashes` + `prompt_len` instead of
    text). Exactly one of `prompt` and `messages` is set."""

    model: str = ""
    prompt: str | list[Int64] | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: Int64 | None = None
    priority: Int64 = 0
    temperature: float | None = None
    top_p: float | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    n: Int64 = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    max_completion_tokens: Int64 | None = None
    ignore_eos: bool = False
    request_id: str | None = None
    tenant: str | None = None
    block_hashes: list[Int64] | None = None
    prompt_len: Int64 | None = None
    ttft_slo_ms: float | None = None
    """The client's own TTFT deadline (ms after admission); default: its class's target."""
    tpot_slo_ms: float | None = None
    """The client's TPOT SLO (ms per output token) for SCORPIO's engine scheduling."""
    # OpenAI's (and vLLM's) fields that no engine here honours. Declared so that a request asking
    # for one is refused by name (shared.validation.UNSUPPORTED: only the value that asks for
    # nothing passes), instead of being decoded without it and answered as if it had been heard.
    logprobs: bool | Int64 | None = None
    top_logprobs: Int64 | None = None
    echo: bool | None = None
    best_of: Int64 | None = None
    suffix: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None


# ───────────────────────────── stream events ─────────────────────────────


class Usage(msgspec.Struct):
    prompt_tokens: Int64
    completion_tokens: Int64
    total_tokens: Int64
    cached_tokens: Int64 = 0
    """Prompt tokens served from the prefix cache (vLLM's prompt_tokens_details.cached_tokens)."""


class Accepted(msgspec.Struct, tag="accepted", tag_field="type"):
    request_id: str
    priority: Int64
    """The resolved class, 0 (P0) … 3 (P3)."""
    prompt_tokens: Int64


class Rejected(msgspec.Struct, tag="rejected", tag_field="type"):
    request_id: str
    status: Int64
    """The HTTP status the edge answers with: 400, 404, 409 (a reused request id), 413, 429, 503."""
    code: str
    """OpenAI's error `code` (e.g. `invalid_value`, `model_not_found`)."""
    message: str
    param: str | None = None
    retry_after_s: float | None = None
    queue_depth: Int64 | None = None
    """Requests waiting in the priority queue when admission refused (429 / 503)."""
    reason: str = ""  # the metrics reason where it differs from `code` (admission's beyond_class_cap)


class Chunk(msgspec.Struct, tag="chunk", tag_field="type", omit_defaults=True):
    request_id: str
    seq: Int64
    """0, 1, 2 … per request, so a receiver can order and drop duplicates."""
    text: str
    token_ids: list[Int64]
    accepted: Accepted | None = None
    """On a stream's first chunk (seq 0) only: admission's `accepted` as the worker knows it. The
    two leave two processes, so either may arrive first; a receiver that has only the chunk holds
    the request as accepted by it (TokenyardClient does). Absent on every other chunk."""
    worker_id: str = ""
    """On the first chunk each worker sends for the stream: who runs it now (shared/stream_watch.py)."""


class Finished(msgspec.Struct, tag="finished", tag_field="type"):
    request_id: str
    seq: Int64
    finish_reason: str
    """`stop`, `length` or `abort`."""
    usage: Usage
    worker_id: str = ""
    ttft_ms: float | None = None


class Error(msgspec.Struct, tag="error", tag_field="type"):
    request_id: str
    status: Int64
    message: str
    seq: Int64 = -1


StreamEvent = Accepted | Rejected | Chunk | Finished | Error
TERMINAL_EVENTS = (Rejected, Finished, Error)


# ───────────────────────────── internal data path ─────────────────────────────


class Sampling(VllmSampling, omit_defaults=True):
    """The sampling a request runs with, as the worker's engine gets it (shared.validation.sampling)."""

    temperature: float | None = None
    top_p: float | None = None
    seed: Int64 | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False


class AdmittedRequest(msgspec.Struct, omit_defaults=True):
    """A request admission validated, tokenized and hashed; it travels unchanged through the
    queue and the router to the worker, so no later hop tokenizes again."""

    request_id: str
    reply_to: str
    model: str
    prompt_token_ids: list[Int64]
    """Empty for a trace replay that sent block hashes only."""
    prompt_len: Int64
    block_hashes: list[Int64]
    """The chain over the prompt's full blocks (shared.hashing)."""
    block_size: Int64
    max_tokens: Int64
    priority: Int64
    """The resolved PriorityClass value."""
    arrival_s: float
    """Wall-clock time admission saw the request (unix seconds)."""
    json: bool = False
    """Answer the client in JSON rather than MessagePack."""
    tenant: str = ""
    declared_priority: Int64 = 0
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    kind: str = "completion"
    """`completion` or `chat`: what the edge renders back."""
    deadline_s: float = 0.0
    """Absolute TTFT deadline (unix seconds), admission's `shared.slo.ttft_deadline_s`: the
    client's ttft_slo_ms, else class target + own predicted prefill, capped; 0 = none (P3,
    or a request made without admission: then arrival + its class's target)."""
    tpot_slo_ms: float = 0.0
    """Per-request TPOT SLO (SCORPIO); 0 = none."""
    resume_token_ids: list[Int64] = msgspec.field(default_factory=list)
    """Migration: the tokens the client already received from a worker that died. The next
    worker prefills prompt + these and generates the rest (max_tokens counts both)."""
    resume_seq: Int64 = 0
    """Migration: the seq of the first chunk the next worker sends (the client's next one)."""
    migrations: Int64 = 0
    """How many times this request moved to another worker (capped by the router)."""
    prefill_s: float = 0.0
    """Its own prefill as admission predicted it (fastest fresh worker, whole prompt); 0 =
    unknown. The queue releases it by deadline − prefill − H (shared.slo.latest_release_s)."""
    kv_from: str = ""
    """Spatial P/D's decode leg: the prefill worker that computed its KV and first token; a
    decode worker receives the KV and makes the remaining tokens. Empty: a new request."""


AdmittedRequestInTransit = in_transit(AdmittedRequest, "prompt_token_ids", __name__)
"""An AdmittedRequest as the hops that pass it on read it (the queue, the router): every field
but the prompt's tokens, which stay encoded, so a re-encoded one (a migration's re-issue) is
whole again. Decoding an 8k-token prompt's tokens costs ~0.3 ms of CPU at each hop that
builds them; only the worker needs them. Derived from AdmittedRequest, so it cannot drift;
the cores read it as one (every other attribute is the same)."""


class RouteDecision(msgspec.Struct, omit_defaults=True):
    """The router's answer to the queue on `llm.v1.route`."""

    request_id: str
    outcome: str
    """Outcome.ROUTED or Outcome.NO_CAPACITY."""
    worker_id: str = ""
    reason: str = ""
    unsure: bool = False
    """With NO_CAPACITY: an offer went unanswered (a timeout), so that worker may hold the
    request; the queue asks again (the router offers it to that worker first) and does not
    expire it meanwhile."""


class GenerateReply(msgspec.Struct, omit_defaults=True):
    """A worker's answer on `llm.v1.worker.<id>.generate`."""

    request_id: str
    accepted: bool
    reason: str = ""
    """Why it was refused; with `accepted`: '' (generating now), REOFFERED (the same request
    again) or Outcome.DUPLICATE (a reused id: its client gets a 409)."""


REOFFERED = "reoffered"
"""A worker's accepting reply to a request it already took (the same id and reply subject: a
queue's JetStream redelivery, its re-ask after a lost answer, a router's retry after a slow
reply): nothing is generated twice and nothing goes to the client. Not "duplicate": that
is Outcome.DUPLICATE, the other request that reused an id, which gets a 409 — and a
StrEnum member equals its string, so the two must not share a value."""


class Abort(msgspec.Struct, omit_defaults=True):
    request_id: str
    reason: str = "client"
    """Why: `client`, `client_left` / `client_cancelled` / … (TokenyardClient's), `orphaned` (its client's lease lapsed), or MIGRATED."""
    reply_to: str = ""
    """Only the generation streaming to this subject ('': any of the id): a reused id's newcomer,
    placed before its store found the id taken, while the first request of the id runs on."""
    before_migration: Int64 = -1
    """A MIGRATED fence: only generations started before this migration (their `migrations`
    below it) stop — not the re-issue it fences for, which a worker may have taken before this
    abort reached it (the abort and the offer arrive on two subscriptions, handled in either
    order). -1: every generation of the id."""


MIGRATED = "migrated"
"""The abort reason of the router's migration fence: the request now runs on another worker,
so the old one stops without a word to the client and keeps the id open."""


# ───────────────────────────── fleet state ─────────────────────────────


class EngineStats(msgspec.Struct, omit_defaults=True):
    """An engine's state as its worker reports it (`Engine.stats()`), carried whole in each
    Heartbeat: a stat added here reaches every reader without another copy step."""

    running: Int64
    """Running batch size (decode load)."""
    waiting: Int64
    queued_prefill_tokens: Int64
    """Prompt tokens accepted but not yet prefilled: the P-token load."""
    kv_blocks_used: Int64
    """GPU KV tier (hot); the host tier is kv_host_blocks_* below."""
    kv_blocks_free: Int64
    block_size: Int64
    step_time_ms: float = 0.0
    prefix_hits: Int64 = 0
    """Prompt tokens found cached, summed over requests."""
    prefix_queries: Int64 = 0
    """Prompt tokens looked up, summed over requests."""
    preemptions: Int64 = 0
    kv_host_blocks_used: Int64 = 0
    """Host-memory KV tier (warm): blocks holding demoted prefixes or swapped requests."""
    kv_host_blocks_free: Int64 = 0
    tpot_slack_ms: float | None = None
    """EcoServe: saved TPOT slack of the running decodes (the minimum over them, ms): how far
    ahead of its TPOT SLO the tightest one runs. None: nothing is decoding."""
    compute_util: float = 0.0
    """Share of the last step's token budget that was scheduled (EcoServe's saturation test)."""
    prefill_ms_per_token: float = 0.0
    """The engine's prefill cost per token at a full chunk, for EcoServe's prefill-time
    estimate (pending tokens × this); 0: unknown."""
    vbs: float = 0.0
    """SCORPIO: the running set's virtual batch size Σ TRP(r); 0: none runs (or no SCORPIO)."""
    min_tpot_slo_ms: float = 0.0
    """SCORPIO: the tightest TPOT SLO of the running set; 0: none."""
    vbs_limit: float = 0.0
    """SCORPIO: the largest VBS whose estimated TPOT meets min_tpot_slo_ms (VBS filter); 0: unknown."""
    prefill_ms_per_token2: float = 0.0
    """Attention's share of a prefill: an uncached prompt of L tokens takes about
    L·prefill_ms_per_token + L²·this ms (admission's per-request TTFT feasibility); 0: unknown."""
    decode_ms_per_ctx_token: float = 0.0
    """Decode attention: what one decoding sequence adds to a step per token of its context (ms);
    a running decode of context K costs each step about prefill_ms_per_token + K·this
    (admission's sustainable drain: the decodes a burst's requests will run). 0: unknown."""
    queued_prefill_ahead: list[Int64] = msgspec.field(default_factory=list)
    """Per class c (P0..P3): the prompt tokens not yet prefilled that a new class-c request
    would wait behind in the engine's order (vLLM's priority scheduling: the running requests'
    remaining prefill, then the waiting ones of class ≤ c; shared.slo.engine_saturated); the
    last equals queued_prefill_tokens. Empty: not reported (queued_prefill_tokens for all).
    queued_prefill_ahead_net: each waiting one net of the prefix it finds cached now."""
    queued_prefill_ahead_net: list[Int64] = msgspec.field(default_factory=list)


class Heartbeat(msgspec.Struct, omit_defaults=True):
    """A worker's state, every ~100 ms and on large changes, on `llm.v1.hb.<id>`: who it is
    and what the controllers told it (identity, phase, drain) beside its engine's stats."""

    worker_id: str
    model: str
    seq: Int64
    ts: float
    stats: EngineStats
    """The engine's load, KV and cost figures, as `Engine.stats()` returned them."""
    phase: str = Phase.MIXED
    healthy: bool = True
    engine: str = "sim"
    draining: bool = False
    macro_id: str = ""
    mode: str = ""
    """Its macro-instance's mode as the last WorkerControl said (`ecoserve`, `pd`, …; empty:
    none): the queue's flow control treats an EcoServe prefill phase apart (shared.ecoserve.
    prefill_phase_starved)."""
    output_share: float = 0.0
    """Σ completion tokens ÷ Σ max_tokens over the requests this worker finished lately (both
    sums decayed by 1 − 1/32 per finish): the share of the output a request asks for that it
    runs (EOS, stop strings and aborts end it sooner). Admission's sustainable drain prices
    the decodes by it. 0: none finished yet."""
    interval_s: float = 0.0
    """How often this worker sends a heartbeat when nothing else prompts one (its shell's
    `heartbeat_s`): admission counts it gone after 10 such intervals of silence
    (services/admission/liveness.py). 0: not said (the fleet default,
    config.HEARTBEAT_INTERVAL_S)."""


class WorkerControl(msgspec.Struct, omit_defaults=True):
    """macro-instance → worker on `llm.v1.worker.<id>.control`."""

    worker_id: str
    phase: str = Phase.MIXED
    macro_id: str = ""
    drain: bool = False
    epoch: Int64 = 0
    mode: str = ""
    """The macro-instance's mode: `pd` makes a prefill-phase worker hand each request off
    after its first token (spatial P/D); `ecoserve` lets a prefill-phase worker with too small a
    backlog to stay in its phase take more (shared.ecoserve.prefill_phase_starved); empty or
    other modes: nothing changes."""


class MacroState(msgspec.Struct, omit_defaults=True):
    """A macro-instance's state on `llm.v1.macro.<id>.state` and in the topology bucket."""

    macro_id: str
    mode: str
    workers: list[str]
    phases: dict[str, str]
    """worker id → Phase."""
    accepting: list[str]
    """Workers new requests may go to now (all of them in NoDG)."""
    epoch: Int64
    ts: float
    ttft_slo_ms: float = 0.0
    """EcoServe: the SLOs the router's constraint check holds this group's workers to."""
    tpot_slo_ms: float = 0.0
