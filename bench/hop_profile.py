"""Where the control plane's time to first token goes, hop by hop.

A fleet of zero-latency workers (as in control_plane.py) is started with tracing on: every
service exports its spans over OTLP/HTTP to a small receiver in this process. Requests go out
one at a time at a low rate (max_tokens = 1), each with a `traceparent` of its own, so every
hop's span lands in that request's trace. Span timestamps are the host's wall clock in every
process, so they compare across processes. A request's TTFT, t_first − t_send as the client
sees it, is cut at the spans' edges and at the instants the hops note on their spans (when
spans are recorded) into contiguous segments that sum to it exactly. The cuts follow the
first token's critical path, not the spans' ends: admission answers `accepted` after
JetStream's ack, but the queue may have the message before that ack comes back.

    client → edge            edge span start − t_send                      (HTTP path only)
    edge → admission         admission span start − edge span start        (HTTP path only)
    client → admission       admission span start − t_send                 (NATS path only)
    admission                decode, checks, tokenize, encode: admission span start →
                             the JetStream publish (`tokenyard.enqueue_ns`)
    JetStream → queue        JetStream stores the message and delivers it to the queue's
                             standing pull: publish → the queue's callback has it
                             (`tokenyard.received_ns` on the queue's span); with admission in
                             the queue's process (the default), the hand-over by a call
                             (QueueShell.take), the store running beside the path
    queue                    decode, order, release: received → the route request sent
                             (the queue's `send llm.v1.route` span start)
    queue → router           route request sent → router span start
    router                   the decision, the follow subscription: router span start →
                             its offer to the worker (`send llm.v1.worker.…` span start)
    router → worker          offer sent → the worker's endpoint has it (`tokenyard.received_ns`
                             on the worker's span)
    worker                   decode, accept, answer the router, start the engine, the first
                             token, encode: received → the first chunk handed to NATS
                             (`tokenyard.first_event_ns`)
    worker → client          t_first − the first chunk's publish

Recording spans costs each hop some time of its own (an SDK span is ~0.2 ms of Python), so
the total here exceeds the TTFT measured without tracing; the split is what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

ENGINE_HTTP = "engine-http"
ALONE = {"nats": "engine", "http": ENGINE_HTTP}
"""Per path, the engine reached without the control plane: offered to a worker over NATS, or
a worker's own OpenAI HTTP front (`tokenyard worker --http`)."""
NATS_SEGMENTS = ("client → admission", "admission", "JetStream → queue", "queue", "queue → router", "router",
                 "router → worker", "worker", "worker → client")
HTTP_SEGMENTS = ("client → edge", "edge → admission", *NATS_SEGMENTS[1:])


@dataclass
class Span:
    service: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


@dataclass
class SpanReceiver:
    """An OTLP/HTTP trace receiver (protobuf), keeping spans by trace id."""

    traces: dict[int, list[Span]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = ExportTraceServiceRequest()
        body.ParseFromString(await request.read())
        for rs in body.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    span = Span(attrs.get("tokenyard.service", ""), s.name, s.start_time_unix_nano,
                                s.end_time_unix_nano, attrs)
                    self.traces.setdefault(int.from_bytes(s.trace_id, "big"), []).append(span)
        self.arrived.set()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def wait_for(self, trace_ids: list[int], timeout_s: float = 20.0) -> None:
        """Until every trace has its worker span (the last to end), or the timeout."""
        async with asyncio.timeout(timeout_s):
            while not all(any(s.service == "worker" for s in self.traces.get(t, ())) for t in trace_ids):
                self.arrived.clear()
                await self.arrived.wait()


def _value(v) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Sent:
    trace_id: int
    t_send_ns: int
    t_first_ns: int


def segments(spans: list[Span], sent: Sent, http: bool) -> dict[str, float] | None:
    """The request's TTFT cut into contiguous segments (ms); None if a span is missing."""
    def one(service: str, prefix: str) -> Span | None:
        return next((s for s in spans if s.service == service and s.name.startswith(prefix)), None)

    edge, adm = one("edge", "publish"), one("admission", "process")
    queue, router = one("queue", "process"), one("router", "process")
    route, offer = one("queue", "send llm.v1.route"), one("router", "send llm.v1.worker.")
    worker = one("worker", "process")
    if None in (adm, queue, route, router, offer, worker) or (http and edge is None):
        return None
    noted = (adm.attributes.get("tokenyard.enqueue_ns"), queue.attributes.get("tokenyard.received_ns"),
             worker.attributes.get("tokenyard.received_ns"), worker.attributes.get("tokenyard.first_event_ns"))
    if not all(noted):
        return None
    enqueued, received, offered, first = noted
    cuts = [sent.t_send_ns, *([edge.start_ns] if http else []), adm.start_ns, enqueued, received, route.start_ns,
            router.start_ns, offer.start_ns, offered, first, sent.t_first_ns]
    names = HTTP_SEGMENTS if http else NATS_SEGMENTS
    return {n: (b - a) / 1e6 for n, a, b in zip(names, cuts[:-1], cuts[1:], strict=True)}


def traceparent() -> tuple[int, str]:
    trace_id = random.getrandbits(128) or 1
    return trace_id, f"00-{trace_id:032x}-{random.getrandbits(64) or 1:016x}-01"


async def send_nats(client, model: str, prompt: str) -> Sent:
    from tokenyard.shared import schemas

    trace_id, header = traceparent()
    t_send, t_first = time.time_ns(), 0
    async for event in client.stream(schemas.GenerateRequest(model=model, prompt=prompt, max_tokens=1),
                                     headers={"traceparent": header}):
        if isinstance(event, schemas.Chunk) and not t_first:
            t_first = time.time_ns()
    return Sent(trace_id, t_send, t_first)


async def send_engine(nc, worker_id: str, model: str, prompt: str) -> Sent:
    """The engine alone: the request as admission would have made it, offered straight to a
    worker's generate endpoint (what the router does), its stream on an inbox of ours. The
    control plane's added TTFT is the full path's less this one's: both end with the worker's
    first chunk crossing to the client."""
    import uuid

    from tokenyard.shared import codec, config, hashing, schemas, subjects

    ids = list(prompt.encode())
    inbox, events = nc.new_inbox(), asyncio.Queue()

    async def deliver(msg) -> None:
        events.put_nowait((time.time_ns(), msg))

    sub = await nc.subscribe(inbox, cb=deliver)
    try:
        ar = schemas.AdmittedRequest(
            request_id=uuid.uuid4().hex, reply_to=inbox, model=model, prompt_token_ids=ids, prompt_len=len(ids),
            block_hashes=hashing.hash_chain(ids, config.BLOCK_SIZE), block_size=config.BLOCK_SIZE, max_tokens=1,
            priority=int(schemas.PriorityClass.P1), arrival_s=time.time())
        data = codec.encode(ar)
        t_send, t_first = time.time_ns(), 0
        reply = await nc.request(subjects.worker_generate(worker_id), data, timeout=5.0)
        if not codec.decode(reply.data, schemas.GenerateReply).accepted:
            return Sent(0, t_send, 0)
        while True:
            async with asyncio.timeout(5.0):
                t, msg = await events.get()
            event = codec.decode_event(msg.data, msg.headers)
            if isinstance(event, schemas.Chunk) and not t_first:
                t_first = t
            if isinstance(event, schemas.TERMINAL_EVENTS):
                return Sent(0, t_send, t_first)
    finally:
        await sub.unsubscribe()


async def worker_ids(nc, timeout_s: float = 3.0) -> list[str]:
    """The workers heard from on the heartbeat subject within `timeout_s` (at least one)."""
    from tokenyard.shared import subjects

    seen: set[str] = set()
    heard = asyncio.Event()

    async def on_hb(msg) -> None:
        seen.add(subjects.last_token(msg.subject))
        heard.set()

    sub = await nc.subscribe(subjects.HEARTBEAT_ALL, cb=on_hb)
    try:
        async with asyncio.timeout(timeout_s):
            await heard.wait()
        await asyncio.sleep(0.5)  # the other workers' heartbeats of the same round
    finally:
        await sub.unsubscribe()
    return sorted(seen)


async def send_http(http: aiohttp.ClientSession, url: str, model: str, prompt: str) -> Sent:
    trace_id, header = traceparent()
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True}
    t_send, t_first = time.time_ns(), 0
    async with http.post(f"{url}/v1/completions", json=body, headers={"traceparent": header}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {") and not t_first:
                t_first = time.time_ns()
    return Sent(trace_id, t_send, t_first)


async def wait_healthy(http: aiohttp.ClientSession, urls: list[str], timeout_s: float = 30.0) -> None:
    """Until each HTTP front answers /health with 200 (a worker's front starts after it registers)."""
    async with asyncio.timeout(timeout_s):
        for url in urls:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)


def summarise(rows: list[dict[str, float]], names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Median and mean of each segment and of the total; empty without rows (a fleet whose
    code notes no instants, e.g. an older commit's beside this tree's)."""
    if not rows:
        return {}
    out = {n: {"p50_ms": statistics.median(r[n] for r in rows),
               "mean_ms": statistics.fmean(r[n] for r in rows)} for n in names}
    totals = [sum(r.values()) for r in rows]
    out["total (TTFT)"] = {"p50_ms": statistics.median(totals), "mean_ms": statistics.fmean(totals)}
    return out


async def profile(workers: int, model: str, requests: int, rate: float, warmup: int = 20,
                  prompt: str = "a short prompt of a few words", router: str = "in-queue",
                  admission: str = "in-queue") -> dict[str, Any]:
    """Per-hop medians over `requests` requests on each path (NATS, HTTP)."""
    result = await side_by_side({"": {}}, workers, model, requests, rate, traced=True, warmup=warmup, prompt=prompt,
                                routers={"": router}, admissions={"": admission})
    return {"requests": requests, "rate": rate, **result[""]}


async def side_by_side(fleets: dict[str, dict[str, str]], workers: int, model: str, requests: int, rate: float,
                       traced: bool, warmup: int = 20,
                       prompt: str = "a short prompt of a few words",
                       routers: dict[str, str] | None = None,
                       admissions: dict[str, str] | None = None,
                       edges: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """One fleet per label (its environment: e.g. bench/baseline.py's, to run another commit's
    code), all up at once; the requests go to them in turn (a fresh random order each round),
    so each fleet sees the same machine at the same moments. Per label and path: the client's
    TTFT percentiles and, when `traced`, the per-hop segments. `routers`: label → where that
    fleet runs its router (FleetProcesses.router; default in the queue's process); `admissions`:
    the same for admission (FleetProcesses.admission); `edges`: its edge processes
    (FleetProcesses.edge_processes; default 0, the edge in the queue's process)."""
    from tokenyard.shared import natsutil
    from tokenyard.shared.client import TokenyardClient

    from tokenyard.launcher import FleetProcesses

    receiver = SpanReceiver()
    port = await receiver.start()
    tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    out: dict[str, dict[str, Any]] = {label: {} for label in fleets}
    try:
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession())
            up: dict[str, tuple[Any, Any]] = {}
            for label, env in fleets.items():
                fleet = await stack.enter_async_context(FleetProcesses(
                    workers=workers, profile="zero", http_port=0, model=model,
                    router=(routers or {}).get(label, "in-queue"), admission=(admissions or {}).get(label, "in-queue"),
                    edge_processes=(edges or {}).get(label, 0),
                    extra_env={**env, **(tracing if traced else {})}, worker_http=not traced))
                await wait_healthy(http, fleet.worker_http_urls)
                client = await stack.enter_async_context(await TokenyardClient.connect(fleet.nats_url))
                up[label] = (fleet, client)
            admin = {}  # label → an operator's connection and the workers (the engine alone)
            if not traced:
                for label, (fleet, _) in up.items():
                    nc = await natsutil.connect(fleet.nats_url, "bench-engine-alone")
                    stack.push_async_callback(nc.close)
                    admin[label] = (nc, await worker_ids(nc))
            for path, names in (("nats", NATS_SEGMENTS), ("http", HTTP_SEGMENTS)):
                async def one(label: str, kind: str, turn: int) -> Sent:
                    fleet, client = up[label]
                    if kind == "engine":
                        nc, wids = admin[label]
                        return await send_engine(nc, wids[turn % len(wids)], model, prompt)
                    if kind == ENGINE_HTTP:  # the engine alone over HTTP: a worker's own front
                        urls = fleet.worker_http_urls
                        return await send_http(http, urls[turn % len(urls)], model, prompt)
                    if kind == "nats":
                        return await send_nats(client, model, prompt)
                    return await send_http(http, fleet.http_url, model, prompt)

                # Untraced, each round also sends a request to the engine alone, in the same
                # shuffled order, so both see the same machine: over NATS offered straight to a
                # worker, over HTTP to a worker's own HTTP front.
                kinds = (path, ALONE[path]) if not traced else (path,)
                order = [(label, kind) for label in fleets for kind in kinds]
                for turn in range(warmup):
                    for label, kind in order:
                        await one(label, kind, turn)
                sent: dict[tuple[str, str], list[Sent]] = {target: [] for target in order}
                idle = await idle_cpu_rates({label: fleet for label, (fleet, _) in up.items()}, IDLE_WINDOW_S)
                cpu0, t0 = {label: cpu_seconds(fleet) for label, (fleet, _) in up.items()}, time.monotonic()
                for turn in range(requests):
                    random.shuffle(order)
                    for target in order:
                        sent[target].append(await one(*target, turn))
                        await asyncio.sleep(1.0 / rate)  # pacing: one request at a time, none queued
                cpu1, wall = {label: cpu_seconds(fleet) for label, (fleet, _) in up.items()}, time.monotonic() - t0
                for (label, kind), sents in sent.items():
                    ttfts = sorted((s.t_first_ns - s.t_send_ns) / 1e6 for s in sents if s.t_first_ns)
                    out[label][kind] = {"ttft": percentiles(ttfts), "completed": len(ttfts), "sent": len(sents)}
                    if kind != path:
                        continue
                    out[label][path + "_cpu_ms_per_request"] = {
                        name: (cpu1[label][name] - cpu0[label][name]) * 1e3 / requests / len(kinds)
                        for name in cpu0[label]}
                    out[label][path + "_busy_cpu_ms_per_request"] = {  # less what it spends idle
                        name: (cpu1[label][name] - cpu0[label][name] - idle[label].get(name, 0.0) * wall) * 1e3
                        / requests / len(kinds) for name in cpu0[label]}
                    if traced:
                        await receiver.wait_for([s.trace_id for s in sents])
                        rows = [r for s in sents if (r := segments(receiver.traces[s.trace_id], s, path == "http"))]
                        out[label][path].update(traced=len(rows), segments=summarise(rows, names))
                for label in fleets:
                    if len(kinds) == 2:
                        out[label][path]["added"] = added(sent[(label, path)], sent[(label, ALONE[path])])
    finally:
        await receiver.stop()
    return out


async def engine_paired(nats_url: str, model: str, requests: int, rate: float, warmup: int = 20,
                        prompt: str = "a short prompt of a few words", http_url: str | None = None,
                        worker_urls: list[str] | None = None) -> dict[str, Any]:
    """On a running fleet: requests through the control plane (NATS) and to the engine alone,
    one at a time, in a fresh random order each round; with `http_url` (the edge) and
    `worker_urls` (the workers' own HTTP fronts) the same over HTTP, in the same rounds. Their
    TTFTs, and `added` (NATS) / `http_added`."""
    from tokenyard.shared import natsutil
    from tokenyard.shared.client import TokenyardClient

    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(await TokenyardClient.connect(nats_url))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        nc = await natsutil.connect(nats_url, "bench-engine-alone")
        stack.push_async_callback(nc.close)
        wids = await worker_ids(nc)
        with_http = bool(http_url and worker_urls)
        if with_http:
            await wait_healthy(http, worker_urls)

        async def one(kind: str, turn: int) -> Sent:
            if kind == "engine":
                return await send_engine(nc, wids[turn % len(wids)], model, prompt)
            if kind == ENGINE_HTTP:
                return await send_http(http, worker_urls[turn % len(worker_urls)], model, prompt)
            if kind == "http":
                return await send_http(http, http_url, model, prompt)
            return await send_nats(client, model, prompt)

        order = ["nats", "engine", *(["http", ENGINE_HTTP] if with_http else [])]
        for turn in range(warmup):
            for kind in order:
                await one(kind, turn)
        sent: dict[str, list[Sent]] = {kind: [] for kind in order}
        for turn in range(requests):
            random.shuffle(order)
            for kind in order:
                sent[kind].append(await one(kind, turn))
                await asyncio.sleep(1.0 / rate)
    out: dict[str, Any] = {}
    for kind, sents in sent.items():
        ttfts = sorted((s.t_first_ns - s.t_send_ns) / 1e6 for s in sents if s.t_first_ns)
        out[kind] = {"ttft": percentiles(ttfts), "completed": len(ttfts), "sent": len(sents)}
    out["added"] = added(sent["nats"], sent["engine"])
    if with_http:
        out["http_added"] = added(sent["http"], sent[ENGINE_HTTP])
    return out


def added(full: list[Sent], alone: list[Sent]) -> dict[str, float]:
    """What the control plane adds to the first token: the full path's TTFT less the engine
    alone's, p50 of each taken apart (`p50_ms`) and the median of the differences of the
    requests sent in the same round (`paired_p50_ms`)."""
    def ms(s: Sent) -> float | None:
        return (s.t_first_ns - s.t_send_ns) / 1e6 if s.t_first_ns else None

    a = [x for s in full if (x := ms(s)) is not None]
    b = [x for s in alone if (x := ms(s)) is not None]
    pairs = [x - y for f, e in zip(full, alone, strict=True) if (x := ms(f)) is not None and (y := ms(e)) is not None]
    if not a or not b:
        return {}
    return {"p50_ms": statistics.median(a) - statistics.median(b), "paired_p50_ms": statistics.median(pairs),
            "engine_p50_ms": statistics.median(b)}


IDLE_WINDOW_S = 3.0
"""How long a fleet's idle CPU (heartbeats, polls, stats loops) is sampled before a measured run."""


async def idle_cpu_rates(fleets: dict[str, Any], window_s: float) -> dict[str, dict[str, float]]:
    """Per fleet and process: CPU seconds per second spent with no request in flight."""
    before, t0 = {label: cpu_seconds(f) for label, f in fleets.items()}, time.monotonic()
    await asyncio.sleep(window_s)
    wall = time.monotonic() - t0
    return {label: {name: (v - before[label][name]) / wall for name, v in cpu_seconds(f).items()}
            for label, f in fleets.items()}


def cpu_seconds(fleet) -> dict[str, float]:
    """CPU time (user + system) each of the fleet's processes has used so far, by name."""
    procs = [("nats-server", fleet.server.proc), *fleet.procs]
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, proc in procs:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            key = "workers" if name.startswith("worker") else name
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


def percentiles(sorted_ms: list[float]) -> dict[str, float]:
    if not sorted_ms:
        return {}
    def q(p: float) -> float:
        return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]
    return {"p50_ms": statistics.median(sorted_ms), "p90_ms": q(0.90), "p99_ms": q(0.99),
            "mean_ms": statistics.fmean(sorted_ms)}
