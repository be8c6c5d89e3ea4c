"""NATS subjects of tokenyard, versioned by the `llm.v1` prefix (docs/ARCHITECTURE.md §3).

Every subject a service publishes or subscribes to is named here, so a grep for one of
these constants finds every hop of the data path.
"""

from __future__ import annotations

import re

PREFIX = "llm.v1"

SUBMIT = f"{PREFIX}.submit"
"""client, edge → admission: core request, queue group; the reply subject is the stream."""

QUEUE = f"{PREFIX}.queue"
"""admission → priority-queue, captured by the JetStream stream QUEUE_STREAM."""
QUEUE_STREAM = "LLM_QUEUE"
QUEUE_CONSUMER = "priority-queue"

QUEUE_STATS = f"{PREFIX}.pq.stats"
"""priority-queue: depth and in-flight counts (micro endpoint)."""

QUEUE_STATE = f"{PREFIX}.pq.state"
"""priority-queue → admission: QueueStats (work waiting per class, drain rate), ~100 ms."""

ROUTE = f"{PREFIX}.route"
"""priority-queue → router: core request/reply, queue group."""
ROUTE_ONLY_HEADER = "Tokenyard-Only-Workers"
"""On a route ask: the comma-separated workers the request may go to (the queue's placement,
QueueCore.placed_on); absent: any."""

OFFER_PREFILL_HEADER = "Tokenyard-Prefill"
"""On an offer (router → worker): "here,elsewhere", the request's uncached prompt tokens on that
worker and the fewest on any other (shared.slo.OfferPrefill); the worker's `saturated` refusal
weighs them. Absent: the refusal without them."""

TAKEN_BY_HEADER = "Tokenyard-Taken-By"
"""On a request stored in the queue stream: the queue replica that admission handed it to in
its own process (`tokenyard queue --with-admission`); another replica leaves it to that one
while it lives."""

PLACED_HEADER = "Tokenyard-Placed"
"""On a request stored in the queue stream beside TAKEN_BY_HEADER: the replica that took it had
already placed it on a worker when it stored it (the store follows the route's answer). Its copy
only guards the id (JetStream's duplicate check) and is deleted next; a replica that gets it
before that delete acks it and never places it, even with its taker gone (a crash between the
store and the delete would otherwise run the request twice)."""

RESUBMIT_HEADER = "Tokenyard-Resubmit"
"""On a submit: its client sends it again, its first submit unanswered for natsutil.SUBMIT_ANSWER_S
(lost with an admission process that died). Admission stores it before anything runs, so that a
first that did land is told by a 409 `duplicate_request_id` and nothing else on the inbox."""

ADMISSION_HEALTH = f"{PREFIX}.admission.health"
"""edge → admission: request/reply, queue group; its FleetHealth, an HTTP front's readiness."""

RESUME = f"{PREFIX}.resume"
"""client, edge → admission: request/reply, queue group; a stream whose worker and router are gone,
resumed once by its own client on a new inbox (shared/resume.py)."""

ABORT = f"{PREFIX}.abort"
"""edge, client → workers and queue: fan-out cancel of one request. A `migrated` abort here is
not the router's fence (FENCE) and is dropped: on this subject anyone may publish."""

FENCE = f"{PREFIX}.fence"
"""router → workers: fan-out, the migration fence (an Abort with reason `migrated`: the request
now runs elsewhere; an old generation stops without a word and keeps its id). Only routers may
publish it (shared/nats_auth.py), so no client can silence another's stream."""

ADOPT = f"{PREFIX}.adopt"
"""worker → routers, queue group: follow these streams, their placing router is gone
(shared/adoption.py)."""

LEASE_ALL = f"{PREFIX}.lease.*"
"""client, edge → routers: `llm.v1.lease.<lease>` every second while the client lives; its
inboxes are `_INBOX.<lease>.<n>`, so a router can tell a request's client is gone."""

HEARTBEAT_ALL = f"{PREFIX}.hb.*"
KV_EVENTS_ALL = f"{PREFIX}.kv.*"
MACRO_STATE_ALL = f"{PREFIX}.macro.*.state"

TOPOLOGY_BUCKET = "tokenyard_topology"

# Queue groups: replicas of a stateless service share the load on these.
GROUP_ADMISSION = "admission"
GROUP_ROUTER = "router"


def worker_generate(worker_id: str) -> str:
    """router → worker: core request/reply; the worker accepts or refuses."""
    return f"{PREFIX}.worker.{worker_id}.generate"


def worker_status(worker_id: str) -> str:
    """router → worker: request/reply; the ids of the requests the worker runs (a probe)."""
    return f"{PREFIX}.worker.{worker_id}.status"


def worker_state(worker_id: str) -> str:
    """router → worker: request/reply; the state of the streams a router adopts (shared/adoption.py)."""
    return f"{PREFIX}.worker.{worker_id}.state"


def router_adopted(router_id: str) -> str:
    """worker → router: request/reply; which of these streams (AdoptedAsk) the router adopted, asked
    when its AdoptReply never came (shared/adoption.py). `router_id` must be one subject token."""
    if not _TOKEN.fullmatch(router_id):
        raise ValueError(f"a router id is one subject token, not {router_id!r}")
    return f"{PREFIX}.router.{router_id}.adopted"


ROUTER_ADOPTED_ALL = f"{PREFIX}.router.*.adopted"

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def worker_alive(worker_id: str) -> str:
    """client → worker: request/reply, answered empty; "no responders" says the worker is gone
    (a client whose stream went silent probes it: shared/stream_watch.py)."""
    return f"{PREFIX}.worker.{worker_id}.alive"


def lease(lease_id: str) -> str:
    return f"{PREFIX}.lease.{lease_id}"


def worker_control(worker_id: str) -> str:
    """macro-instance → worker: phase switch, drain."""
    return f"{PREFIX}.worker.{worker_id}.control"


def heartbeat(worker_id: str) -> str:
    return f"{PREFIX}.hb.{worker_id}"


def kv_events(worker_id: str) -> str:
    return f"{PREFIX}.kv.{worker_id}"


def macro_state(macro_id: str) -> str:
    return f"{PREFIX}.macro.{macro_id}.state"


def last_token(subject: str) -> str:
    """The id a per-instance subject carries: `llm.v1.hb.w1` → `w1`."""
    return subject.rsplit(".", 1)[-1]


def middle_token(subject: str) -> str:
    """The id in `llm.v1.macro.<id>.state` or `llm.v1.worker.<id>.generate`."""
    return subject.split(".")[3]


_LEASE = re.compile(r"[0-9a-f]{16}")

_INBOX = re.compile(r"_INBOX(\.[^.*>\s]+)+")


def is_inbox(reply: str | None) -> bool:
    """May a service answer on this reply subject? Only an inbox, `_INBOX.<token>…` (nats' own
    prefix; a secured client reads nothing else, shared/nats_auth.py). NATS lets whoever receives
    a request publish on its reply subject whatever its own permissions (`allow_responses`), so
    the requester picks where the answer lands: a worker's empty `alive` answer on
    `$JS.API.STREAM.DELETE.LLM_QUEUE` deletes the queue's stream, with every admitted request in
    it; admission's on `llm.v1.…` speaks on the fleet's own subjects. A request whose reply is not
    an inbox is not answered (and not run)."""
    return bool(reply) and _INBOX.fullmatch(reply) is not None


def lease_of(reply_to: str) -> str:
    """`_INBOX[.<user>].<lease>.<n>` → `<lease>` (16 hex digits; `<user>` is the inbox prefix of
    a secured connection, shared/nats_auth.py); '' for an inbox without one."""
    parts = reply_to.split(".")
    if parts[0] != "_INBOX" or len(parts) not in (3, 4):
        return ""
    lease = parts[-2]
    return lease if _LEASE.fullmatch(lease) else ""


def alive_subject(reply_to: str) -> str:
    """`_INBOX[.<user>].<lease>.<n>` → `_INBOX[.<user>].<lease>.alive`: what the lease holder
    keeps a subscription on (shared/client.py)."""
    return reply_to.rsplit(".", 1)[0] + ".alive"
