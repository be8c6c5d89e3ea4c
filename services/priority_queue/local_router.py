"""What the queue asks of a router in its own process (`tokenyard queue --with-router`): the
route as a call, not a NATS request/reply (services/router/shell.py RouterShell implements it)."""

from __future__ import annotations

from typing import Protocol

from tokenyard.shared import schemas


class LocalRouter(Protocol):
    """A router in this process (services/router/shell.py RouterShell): asked by a call, not
    over NATS."""

    async def route(self, ar: schemas.AdmittedRequest, data: bytes | None = None,
                    headers: dict[str, str] | None = None,
                    only: frozenset[str] | None = None) -> schemas.RouteDecision: ...
