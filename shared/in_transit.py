"""A message type as a hop that only passes it on reads it: one field kept encoded."""

from __future__ import annotations

import msgspec


def in_transit(t: type[msgspec.Struct], raw: str, module: str) -> type[msgspec.Struct]:
    """`t` with field `raw` kept as MessagePack (msgspec.Raw): decoded without building its
    values, encoded again byte for byte as it came."""
    fields: list = []
    for f in msgspec.structs.fields(t):
        typ = msgspec.Raw if f.name == raw else f.type
        if f.required:
            fields.append((f.name, typ))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, typ, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, typ, f.default))
    return msgspec.defstruct(f"{t.__name__}InTransit", fields, omit_defaults=True, module=module)
