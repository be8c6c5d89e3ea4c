"""Admission in the client's own process (the edge in the queue's process): the narrow port the
client hands a request to by a call instead of a publish on `llm.v1.submit`, and the shape of
the answers that come back that way (shared/client.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from tokenyard.shared import schemas


class LocalAdmission(Protocol):
    """Admission in this process (services/admission/shell.py AdmissionShell.submit): a request
    handed over by a call instead of a publish on `llm.v1.submit`; admission's own answers come
    back through `respond`, straight into the stream's inbox."""

    async def submit(self, body: schemas.GenerateRequest, reply_to: str, headers: dict[str, str],
                     respond: Callable[..., Awaitable[None]]) -> None: ...

    def fleet_health(self) -> schemas.FleetHealth:
        """What it sees of the workers now: the edge's readiness (services/edge/health.py)."""
        ...


class LocalAnswer:
    """An answer admission in this process handed over (`LocalAdmission`), shaped as the NATS
    message it would have been: what a stream's inbox holds."""

    __slots__ = ("subject", "data", "headers")

    def __init__(self, subject: str, data: bytes, headers: dict[str, str] | None) -> None:
        self.subject, self.data, self.headers = subject, data, headers or None
