"""Adoption: a worker whose requests' placing router is gone hands them to a surviving router,
which then follows their streams (and migrates them if that worker dies). The messages:

    worker → `llm.v1.adopt` (routers' queue group):  AdoptAsk(worker_id, requests)
    router → `llm.v1.worker.<id>.state` (request):   [request ids] → [StreamState]
                                                     (the asker is now the one the worker follows)
    router → worker (AdoptAsk's answer):             AdoptReply(adopted ids)

The router subscribes to each request's reply subject before it asks the state, and holds what
arrives until the state comes: no chunk falls between the two.
"""

from __future__ import annotations

import msgspec
from tokenyard.shared.schemas import AdmittedRequest


class AdoptAsk(msgspec.Struct):
    worker_id: str
    requests: list[AdmittedRequest]


class AdoptReply(msgspec.Struct):
    adopted: list[str]


class StreamState(msgspec.Struct):
    """A running request's stream as its worker has sent it: the token ids of its chunks
    (resumed ones first) and the seq of the next."""

    request_id: str
    token_ids: list[int]
    next_seq: int
