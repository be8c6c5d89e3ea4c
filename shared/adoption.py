"""Adoption: a worker whose requests' placing router is gone hands them to a surviving router,
which then follows their streams (and migrates them if that worker dies). The messages:

    worker → `llm.v1.adopt` (routers' queue group):  AdoptAsk(worker_id, requests)
    router → `llm.v1.worker.<id>.state` (request):   [request ids] → [StreamState]
                                                     (the asker is now the one the worker follows)
    router → worker (AdoptAsk's answer):             AdoptReply(adopted ids)
    worker → `llm.v1.router.<id>.adopted` (request): AdoptedAsk(worker_id, ids) → AdoptReply
                                                     (only when the AdoptReply never came)

The router subscribes to each request's reply subject before it asks the state, and holds what
arrives until the state comes: no chunk falls between the two.

A stream's state is told to one router per hand-over, and the worker follows that router for it
once it says it adopted it. If its AdoptReply is lost (a timeout, a dropped reply, a slow router),
the worker does not know: that router may follow the stream, and handing it over again could have
a second one follow it too; if the worker then died, both would re-issue it (two generations on
one stream). So the worker asks that router directly (AdoptedAsk, on the subject its StateAsk
named) which of those streams it follows: it follows those it names, and hands over again only
the rest, or all of them once that router is proven gone ("no responders" twice, the rule for a
placing router). The router answers from its migration tracking, after any adoption of theirs
still under way has ended.

Every message fits the server's max payload less the header room (`message_room`): a worker with
hundreds of long streams hands them over in pieces (`ask_pieces`), each a complete hand-over of
its requests (its own ask, state and reply), sent one after another. Its AdoptAsk fits the room,
and the state its adopter will ask for it fits half of it, the other half left for the tokens
its streams send until then; the worker's state answer still takes only the states that fit
(`WorkerCore.stream_states`). A piece that fails, or a stream left out, stays the gone router's
and is handed over again at a later probe.
"""

from __future__ import annotations

import msgspec
from tokenyard.shared import codec
from tokenyard.shared.openai_api import NATS_HEADER_ROOM
from tokenyard.shared.schemas import AdmittedRequest

LIST_HEADER = 5
"""The most bytes MessagePack takes for a list's length (array32)."""


class AdoptAsk(msgspec.Struct):
    worker_id: str
    requests: list[AdmittedRequest]
    handover: int = 0
    """The worker's serial of this hand-over: the adopter's StateAsk names it, and the worker
    answers only for streams still in that hand-over (not one it gave up on, or a later one)."""


class StateAsk(msgspec.Struct):
    """An adopter's ask for the state of `request_ids`, in the worker's hand-over `handover`."""

    request_ids: list[str]
    handover: int
    router_id: str = ""
    """The asking router's instance id: the worker asks `llm.v1.router.<id>.adopted` which of these
    it adopted if its AdoptReply never comes. Without a valid one the worker tells nothing (it
    could not ask)."""


class AdoptReply(msgspec.Struct):
    adopted: list[str]


class AdoptedAsk(msgspec.Struct):
    """A worker's ask to a router it told these streams' state to, whose AdoptReply never came:
    which of `request_ids` (running on `worker_id`) does it follow? Answered AdoptReply(those)."""

    worker_id: str
    request_ids: list[str]


class StreamState(msgspec.Struct):
    """A running request's stream as its worker has sent it: the token ids of its chunks
    (resumed ones first) and the seq of the next."""

    request_id: str
    token_ids: list[int]
    next_seq: int


def message_room(max_payload: int) -> int:
    """The bytes an adoption message may take: the server's max payload less the header room
    (the edge's rule for a request, shared/openai_api.py)."""
    return max(1024, max_payload - NATS_HEADER_ROOM)


def ask_pieces(worker_id: str, reqs: list[AdmittedRequest], state_bytes: list[int], room: int,
               handover: int = 0) -> list[AdoptAsk]:
    """`reqs` (each with its StreamState's encoded size now, `state_bytes`) in consecutive
    AdoptAsks: each fits `room`, and so does twice its states (the growth until the state is
    asked). A request too big for a piece alone goes alone (it came in a message of the max payload;
    a state too big is left out by the worker's answer, and that stream is not handed over)."""
    base = len(codec.encode(AdoptAsk(worker_id, []))) + LIST_HEADER
    out: list[AdoptAsk] = []
    piece: list[AdmittedRequest] = []
    used = base
    for r, size in zip(reqs, state_bytes, strict=True):
        weight = max(len(codec.encode(r)), 2 * size)
        if piece and used + weight > room:
            out.append(AdoptAsk(worker_id, piece, handover))
            piece, used = [], base
        piece.append(r)
        used += weight
    if piece:
        out.append(AdoptAsk(worker_id, piece, handover))
    return out


def adopted_ask(worker_id: str, request_ids: list[str], room: int) -> AdoptedAsk:
    """An AdoptedAsk of the first of `request_ids` that fit `room` (at least one: an id came in a
    message of the max payload); the rest wait for a later ask."""
    used = len(codec.encode(AdoptedAsk(worker_id, []))) + LIST_HEADER
    ids: list[str] = []
    for rid in request_ids:
        used += len(codec.encode(rid))
        if ids and used > room:
            break
        ids.append(rid)
    return AdoptedAsk(worker_id, ids)
