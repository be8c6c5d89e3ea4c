"""Prometheus metrics of every service, and the `/metrics` endpoint a service process serves.

Names: where a metric means what vLLM's does, it carries vLLM's name and labels
(`vllm:num_requests_running{model_name=…}`, `vllm:time_to_first_token_seconds`, …), so a
dashboard built for a vLLM fleet reads a tokenyard worker as it is; the control plane's own
metrics live under `tokenyard:` with the small outcome enums as labels.

    worker     vllm:num_requests_running / _waiting, vllm:gpu_cache_usage_perc (and vLLM V1's
               vllm:kv_cache_usage_perc), vllm:num_preemptions_total,
               vllm:prefix_cache_queries_total / _hits_total (tokens), vllm:prompt_tokens_total,
               vllm:generation_tokens_total, vllm:request_success_total{finished_reason},
               vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds,
               vllm:e2e_request_latency_seconds; tokenyard:worker_phase{phase},
               tokenyard:worker_queued_prefill_tokens
    admission  tokenyard:admission_decisions_total{outcome}, tokenyard:refusals_total{reason}
    queue      tokenyard:queue_depth{priority}, tokenyard:queue_wait_seconds{priority},
               tokenyard:queue_dispatches_total{outcome}
    router     tokenyard:router_decisions_total{policy,outcome}, tokenyard:router_decision_seconds,
               tokenyard:router_prefix_hit_ratio, tokenyard:router_pxbs_spread
    macro      tokenyard:macro_workers{macro_id,phase}, tokenyard:macro_migrations_total,
               tokenyard:macro_phase_switches_total

Gauges that mirror a snapshot (a worker's heartbeat, the queue's depth) are read when
Prometheus scrapes (a custom collector), so they are never stale by a scrape interval and
cumulative engine counters need no delta bookkeeping. Each service owns a registry of its own:
several shells may share one process (the tests' in-process fleet).

`snapshot()` of each metrics object is the same counters as a dict: the service host puts it
in `$SRV.STATS` (nats.micro's per-endpoint `data`), which is how `tokenyard top` reads
request and refusal rates with nothing but a NATS URL.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable

import numpy as np
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from tokenyard.shared import schemas

# vLLM's buckets (vllm/v1/metrics/loggers.py), so histograms from both compare bucket by bucket.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DECISION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
PRIORITIES = tuple(f"P{c.value}" for c in schemas.PriorityClass)


def _single(metric: Counter | Gauge) -> float:
    """The value of an unlabelled counter or gauge."""
    return next(s.value for m in metric.collect() for s in m.samples if not s.name.endswith("_created"))


def count_samples(counter: Counter) -> dict[str, float]:
    """A labelled counter's values, `label1,label2 → value`, for `$SRV.STATS`."""
    out: dict[str, float] = {}
    for metric in counter.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[",".join(s.labels.values())] = s.value
    return out


class _SnapshotCollector(Collector):
    """Yields the metric families `build()` makes at scrape time."""

    def __init__(self, build: Callable[[], Iterable]):
        self.build = build

    def collect(self):
        yield from self.build()


ABORT_REASONS = frozenset({"client", "orphaned", schemas.MIGRATED, "client_gap", "client_idle_timeout",
                           "client_cancelled", "client_left"})


class WorkerMetrics:
    def __init__(self, worker_id: str, model: str):
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model, "worker_id": worker_id}
        names = list(self.labels)
        self.heartbeat: schemas.Heartbeat | None = None
        """The last heartbeat the worker published: the gauges read it at scrape time."""
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              names, buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                              names, buckets=TPOT_BUCKETS_S, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                             names, buckets=E2E_BUCKETS_S, registry=self.registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names,
                                     registry=self.registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names,
                                         registry=self.registry)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*names, "finished_reason"], registry=self.registry)
        self.aborts = Counter("tokenyard:worker_aborts", "Requests aborted while running here, by who asked "
                              "(Abort.reason: client, client_left, orphaned, migrated, …).", [*names, "reason"],
                              registry=self.registry)
        self.registry.register(_SnapshotCollector(self._from_heartbeat))

    def observe_abort(self, reason: str) -> None:
        """A request aborted while running here; `reason` comes from whoever sent the abort,
        so an unknown one is counted as `other` (a label per client string would grow without bound)."""
        self.aborts.labels(*self.labels.values(), reason if reason in ABORT_REASONS else "other").inc()

    def observe_finished(self, ttft_s: float | None, e2e_s: float, prompt_tokens: int, output_tokens: int,
                         finish_reason: str) -> None:
        lv = self.labels.values()
        if ttft_s is not None:
            self.ttft.labels(*lv).observe(ttft_s)
            if output_tokens > 1:
                self.tpot.labels(*lv).observe((e2e_s - ttft_s) / (output_tokens - 1))
        self.e2e.labels(*lv).observe(e2e_s)
        self.prompt_tokens.labels(*lv).inc(prompt_tokens)
        self.generation_tokens.labels(*lv).inc(output_tokens)
        self.success.labels(*lv, finish_reason).inc()

    def _from_heartbeat(self):
        hb = self.heartbeat
        if hb is None:
            return
        names, values = list(self.labels), list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        s = hb.stats
        total = s.kv_blocks_used + s.kv_blocks_free
        usage = s.kv_blocks_used / total if total else 0.0
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting)
        yield gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", usage)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      s.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      s.prefix_hits)
        yield gauge("tokenyard:worker_queued_prefill_tokens", "Prompt tokens waiting for prefill (P).",
                    s.queued_prefill_tokens)
        yield gauge("tokenyard:worker_step_time_seconds", "Duration of the engine's last step.",
                    s.step_time_ms / 1000.0)
        phase = GaugeMetricFamily("tokenyard:worker_phase", "1 for the phase the worker runs in (EcoServe).",
                                  labels=[*names, "phase", "macro_id"])
        for p in schemas.Phase:
            phase.add_metric([*values, p.value, hb.macro_id], float(hb.phase == p))
        yield phase

    def snapshot(self) -> dict:
        hb = self.heartbeat
        return {"finished": count_samples(self.success), "aborts": count_samples(self.aborts),
                "running": hb.stats.running if hb else 0, "waiting": hb.stats.waiting if hb else 0}


class AdmissionMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter("tokenyard:admission_decisions", "Admission verdicts by outcome.", ["outcome"],
                                 registry=self.registry)
        self.refusals = Counter("tokenyard:refusals", "Refused requests by reason (the OpenAI error code, or a finer one: beyond_class_cap).",
                                ["reason"], registry=self.registry)

    def observe(self, outcome: str, reason: str = "") -> None:
        self.decisions.labels(outcome).inc()
        if reason:
            self.refusals.labels(reason).inc()

    def snapshot(self) -> dict:
        return {"decisions": count_samples(self.decisions), "refusals": count_samples(self.refusals)}


class QueueMetrics:
    def __init__(self, stats: Callable[[], schemas.QueueStats]):
        """`stats`: the core's QueueStats now (read at scrape time)."""
        self.registry = CollectorRegistry()
        self.stats = stats
        self.wait = Histogram("tokenyard:queue_wait_seconds", "Arrival to routed, by priority class.",
                              ["priority"], buckets=WAIT_BUCKETS_S, registry=self.registry)
        self.dispatches = Counter("tokenyard:queue_dispatches", "Requests sent to the router, by outcome.",
                                  ["outcome"], registry=self.registry)
        self.registry.register(_SnapshotCollector(self._depth))

    def observe_dispatch(self, outcome: str, priority: int, wait_s: float) -> None:
        self.dispatches.labels(outcome).inc()
        if outcome == schemas.Outcome.ROUTED:
            self.wait.labels(PRIORITIES[priority]).observe(max(0.0, wait_s))

    def _depth(self):
        s = self.stats()
        depth = GaugeMetricFamily("tokenyard:queue_depth", "Requests waiting, by priority class.", labels=["priority"])
        work = GaugeMetricFamily("tokenyard:queue_work_tokens", "Prompt + max tokens waiting, by priority class.",
                                 labels=["priority"])
        for name, d, w in zip(PRIORITIES, s.depth, s.work_tokens, strict=True):
            depth.add_metric([name], d)
            work.add_metric([name], w)
        yield depth
        yield work
        yield GaugeMetricFamily("tokenyard:queue_in_flight", "Requests sent to the router, not yet answered.",
                                value=s.in_flight)

    def snapshot(self) -> dict:
        s = self.stats()
        return {"depth": dict(zip(PRIORITIES, s.depth, strict=True)), "dispatches": count_samples(self.dispatches)}


class RouterMetrics:
    def __init__(self, policy: str, fleet: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None):
        """`fleet`: P and BS of the fresh workers' rows, read when the spread is scraped (so a
        decision does not pay for a gauge nobody may read)."""
        self.registry = CollectorRegistry()
        self.policy = policy
        self.decisions = Counter("tokenyard:router_decisions", "Routing decisions by policy and outcome.",
                                 ["policy", "outcome"], registry=self.registry)
        self.latency = Histogram("tokenyard:router_decision_seconds", "Request in to worker accepted (all attempts).",
                                 buckets=DECISION_BUCKETS_S, registry=self.registry)
        self.hit_ratio = Histogram("tokenyard:router_prefix_hit_ratio",
                                   "Cached share of the prompt on the chosen worker, per routed request.",
                                   buckets=RATIO_BUCKETS, registry=self.registry)
        self.spread = Gauge("tokenyard:router_pxbs_spread",
                            "max - min over fresh workers of P x BS (queued prefill tokens x batch size).",
                            registry=self.registry)
        if fleet is not None:
            self.spread.set_function(lambda: pxbs_spread(*fleet()))

    def observe(self, outcome: str, seconds: float, hit_tokens: int | None, prompt_len: int) -> None:
        self.decisions.labels(self.policy, outcome).inc()
        self.latency.observe(seconds)
        if hit_tokens is not None and prompt_len > 0:
            self.hit_ratio.observe(min(1.0, hit_tokens / prompt_len))

    def observe_fleet(self, p: np.ndarray, bs: np.ndarray) -> None:
        """P and BS of the fresh workers' rows (without a `fleet` to read at scrape time)."""
        self.spread.set(pxbs_spread(p, bs))

    def snapshot(self) -> dict:
        return {"decisions": count_samples(self.decisions), "pxbs_spread": _single(self.spread)}


def pxbs_spread(p: np.ndarray, bs: np.ndarray) -> float:
    """max − min of P × BS over the rows given; 0 without rows."""
    pxbs = p * bs
    return float(pxbs.max() - pxbs.min()) if len(pxbs) else 0.0


class MacroMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.workers = Gauge("tokenyard:macro_workers", "Workers of a macro-instance by phase.",
                             ["macro_id", "phase"], registry=self.registry)
        self.migrations = Counter("tokenyard:macro_migrations", "Workers moved from one macro-instance to another.",
                                  registry=self.registry)
        self.switches = Counter("tokenyard:macro_phase_switches", "Phase changes sent to workers.",
                                registry=self.registry)
        self._home: dict[str, str] = {}
        self._phase: dict[str, str] = {}

    def observe_states(self, states: Iterable[schemas.MacroState]) -> None:
        """Each changed MacroState the controller publishes: phases per macro, workers that moved."""
        for state in states:
            for p in schemas.Phase:
                self.workers.labels(state.macro_id, p.value).set(0)
            for phase, n in Tally(state.phases.get(w, schemas.Phase.MIXED) for w in state.workers).items():
                self.workers.labels(state.macro_id, phase).set(n)
            for w in state.workers:
                if self._home.get(w, state.macro_id) != state.macro_id:
                    self.migrations.inc()
                self._home[w] = state.macro_id
                phase = state.phases.get(w, schemas.Phase.MIXED)
                if self._phase.get(w, phase) != phase:
                    self.switches.inc()
                self._phase[w] = phase

    def snapshot(self) -> dict:
        return {"migrations": _single(self.migrations), "phase_switches": _single(self.switches)}


async def serve(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """`GET /metrics` on host:port (0: a free port, read it back with `bound_port`)."""

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/metrics", handle)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return runner.addresses[0][1]


def prometheus_config(targets: dict[str, str], scrape_interval_s: float = 5.0) -> str:
    """A prometheus.yml scraping `targets` (service name → `http://host:port/metrics`), one job
    per service kind, so `sum by (job)` reads a replicated service as one."""
    jobs: dict[str, list[str]] = {}
    for name, url in targets.items():
        host_port = url.split("://", 1)[1].split("/", 1)[0]
        jobs.setdefault(name.split("-", 1)[0], []).append(host_port)
    ms = round(scrape_interval_s * 1000)
    interval = f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"  # Prometheus durations take no fractions
    lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}", "scrape_configs:"]
    for job, hosts in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{', '.join(repr(h) for h in hosts)}]"]
    return "\n".join(lines) + "\n"
