"""What a client gathers from one stream (TokenyardClient.generate): the text and token ids of
its chunks, how it finished, and the acceptance, refusal or error it met."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tokenyard.shared import schemas


@dataclass
class Completion:
    """What `generate` gathers from one stream."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: schemas.Usage | None = None
    accepted: schemas.Accepted | None = None
    rejected: schemas.Rejected | None = None
    error: schemas.Error | None = None
    worker_id: str = ""


async def gather(request_id: str, events: AsyncIterator[schemas.StreamEvent]) -> Completion:
    """The stream's events, read to its end, as one Completion."""
    out = Completion(request_id=request_id)
    parts: list[str] = []
    async for event in events:
        out.request_id = event.request_id or out.request_id
        match event:
            case schemas.Accepted():
                out.accepted = event
            case schemas.Chunk():
                parts.append(event.text)
                out.token_ids.extend(event.token_ids)
            case schemas.Finished():
                out.finish_reason, out.usage, out.worker_id = event.finish_reason, event.usage, event.worker_id
            case schemas.Rejected():
                out.rejected = event
            case schemas.Error():
                out.error = event
    out.text = "".join(parts)
    return out
