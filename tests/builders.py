"""Builders of the messages tests feed to cores: one place that knows the structs' fields, so a
new field or a changed default is one edit, not fourteen. Every argument has the value most
tests want; a test names only what it is about.

    req("r1", prompt_len=20)                 an AdmittedRequest with no tokens (routing, queueing)
    req("r1", tokens=[1, 2, …], max_tokens=4)   one an engine can run: token ids, hash chain
    stats(running=3, queued=500)             an EngineStats
    hb("w0", running=3, queued=500)          a Heartbeat carrying those stats
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from tokenyard.shared import hashing
from tokenyard.shared.schemas import AdmittedRequest, EngineStats, Heartbeat

MODEL = "m"
BLOCK = 16


def req(rid: str = "r1", prompt_len: int = 20, max_tokens: int = 4, priority: int = 1, *, model: str = MODEL,
        tokens: Sequence[int] | None = None, chain: Sequence[int] | None = None, block_size: int = BLOCK,
        arrival_s: float = 0.0, reply_to: str | None = None, **fields) -> AdmittedRequest:
    """With `tokens`, the prompt is those ids (prompt_len = their count) and the chain their
    block hashes unless `chain` is given."""
    ids = list(tokens) if tokens is not None else []
    if tokens is not None:
        prompt_len = len(ids)
        if chain is None:
            chain = hashing.hash_chain(ids, block_size)
    return AdmittedRequest(
        request_id=rid, reply_to=f"inbox.{rid}" if reply_to is None else reply_to, model=model,
        prompt_token_ids=ids, prompt_len=prompt_len, block_hashes=list(chain or []), block_size=block_size,
        max_tokens=max_tokens, priority=priority, arrival_s=arrival_s, **fields,
    )


STAT_FIELDS = frozenset(f.name for f in msgspec.structs.fields(EngineStats))


def stats(*, running: int = 0, waiting: int = 0, queued: int = 0, used: int = 0, free: int = 1000,
          block_size: int = BLOCK, **fields) -> EngineStats:
    """An engine's stats: `queued` = queued prefill tokens; `used` / `free` = KV blocks; any
    other EngineStats field by its name."""
    return EngineStats(running=running, waiting=waiting, queued_prefill_tokens=queued, kv_blocks_used=used,
                       kv_blocks_free=free, block_size=block_size, **fields)


def hb(wid: str, *, running: int = 0, waiting: int = 0, queued: int = 0, used: int = 0, free: int = 1000,
       model: str = MODEL, block_size: int = BLOCK, ts: float = 0.0, seq: int = 1, **fields) -> Heartbeat:
    """A Heartbeat: EngineStats fields (as in `stats`, or by name: prefill_ms_per_token=…) go into
    its `stats`; the rest (phase, macro_id, healthy, draining, engine) are the heartbeat's own."""
    own = {k: fields.pop(k) for k in list(fields) if k not in STAT_FIELDS}
    return Heartbeat(worker_id=wid, model=model, seq=seq, ts=ts, **own,
                     stats=stats(running=running, waiting=waiting, queued=queued, used=used, free=free,
                                 block_size=block_size, **fields))
