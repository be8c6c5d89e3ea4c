"""The integer of every message on the bus (shared.schemas, shared.kv_events)."""

from __future__ import annotations

from typing import Annotated

import msgspec

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""Every integer on the bus: MessagePack carries 64 bits, so a larger one JSON can carry (max_tokens
2^70) is refused where decoded, naming the field, not by the encoder of the hop that sends it on."""
