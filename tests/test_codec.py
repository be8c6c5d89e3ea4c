"""shared.codec and shared.schemas: MessagePack / JSON round trips, the stream union's tags,
and KV events in vLLM's array-like tagged shape."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.shared import codec, schemas

EVENTS = [
    schemas.Accepted("r1", 1, 12),
    schemas.Rejected("r1", 429, "rate_limited", "slow down", None, 1.5),
    schemas.Chunk("r1", 0, "ab", [97, 98]),
    schemas.Finished("r1", 1, "length", schemas.Usage(12, 2, 14, 8), "w0", 3.5),
    schemas.Error("r1", 500, "engine failed"),
]


@pytest.mark.parametrize("json", [False, True])
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_stream_events_round_trip_in_both_encodings(event, json):
    assert codec.decode(codec.encode(event, json=json), schemas.StreamEvent, json=json) == event


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_decode_event_detects_the_encoding(event):
    assert codec.decode_event(codec.encode(event, json=True)) == event
    assert codec.decode_event(codec.encode(event, json=False)) == event
    assert codec.decode_event(codec.encode(event, json=True), {"Content-Type": "application/json"}) == event


def test_stream_events_are_tagged_by_type():
    assert codec.encode(schemas.Chunk("r", 0, "a", [97]), json=True) == (
        b'{"type":"chunk","request_id":"r","seq":0,"text":"a","token_ids":[97]}'
    )


def test_a_malformed_event_raises_a_decode_error():
    with pytest.raises(codec.DecodeError):
        codec.decode(b'{"type":"chunk"}', schemas.StreamEvent, json=True)
    with pytest.raises(codec.DecodeError):
        codec.decode(b"\xc1", schemas.StreamEvent)
    with pytest.raises(codec.DecodeError):
        codec.decode(b'{"type":"nope","request_id":"r"}', schemas.StreamEvent, json=True)


def test_is_json_and_content_headers():
    assert codec.is_json({"Content-Type": "application/json; charset=utf-8"})
    assert not codec.is_json({"Content-Type": "application/msgpack"})
    assert not codec.is_json(None)
    assert not codec.is_json({})
    assert codec.content_headers(True) == {"Content-Type": "application/json"}
    assert codec.content_headers(False) == {"Content-Type": "application/msgpack"}


def test_kv_events_have_vllms_array_like_tagged_shape():
    batch = schemas.KVEventBatch(
        1.5,
        [
            schemas.BlockStored([1, 2], None, [3], 16, medium="GPU"),
            schemas.BlockRemoved([1]),
            schemas.AllBlocksCleared(),
        ],
    )
    wire = codec.encode(batch, json=True)
    assert wire == (
        b'[1.5,[["BlockStored",[1,2],null,[3],16,null,"GPU"],["BlockRemoved",[1],null],'
        b'["AllBlocksCleared"]],null]'
    )
    assert codec.decode(wire, schemas.KVEventBatch, json=True) == batch
    assert codec.decode(codec.encode(batch), schemas.KVEventBatch) == batch


def test_a_vllm_style_event_without_trailing_fields_decodes():
    # vLLM versions before `medium` existed send five fields; defaults fill the rest.
    raw = msgspec.msgpack.encode([0.0, [["BlockStored", [7], 6, [1, 2], 2]]])
    batch = codec.decode(raw, schemas.KVEventBatch)
    assert batch.events == [schemas.BlockStored([7], 6, [1, 2], 2)]
    assert batch.events[0].medium is None and batch.data_parallel_rank is None


def test_admitted_request_round_trips_and_omits_defaults():
    req = schemas.AdmittedRequest("r1", "inbox.1", "m", [1, 2], 2, [], 16, 4, 1, 10.0)
    assert codec.decode(codec.encode(req), schemas.AdmittedRequest) == req
    assert b"tenant" not in codec.encode(req, json=True)
    assert req.sampling == schemas.Sampling()


def test_priority_class_and_outcome_values():
    assert [int(p) for p in schemas.PriorityClass] == [0, 1, 2, 3]
    assert schemas.Outcome.ROUTED == "routed"
    assert str(schemas.Phase.MIXED) == "mixed"


@given(tokens=st.lists(st.integers(0, 2**20), max_size=300),
       hashes=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20),
       resume=st.lists(st.integers(0, 2**20), max_size=5), migrations=st.integers(0, 3))
def test_a_request_in_transit_reencodes_byte_for_byte_and_a_changed_one_stays_whole(tokens, hashes, resume, migrations):
    """The queue and the router decode AdmittedRequestInTransit (the prompt's tokens left
    encoded): what they forward is what they got, and a re-issue they change still carries
    every token to the worker."""
    ar = schemas.AdmittedRequest("r1", "_INBOX.c.1", "m", tokens, len(tokens), hashes, 16, 8, 1, 1.5, tenant="t")
    data = codec.encode(ar)
    seen = codec.decode(data, schemas.AdmittedRequestInTransit)
    assert codec.encode(seen) == data
    assert [getattr(seen, f) for f in ar.__struct_fields__ if f != "prompt_token_ids"] == \
        [getattr(ar, f) for f in ar.__struct_fields__ if f != "prompt_token_ids"]
    moved = msgspec.structs.replace(seen, resume_token_ids=resume, migrations=migrations)
    assert codec.decode(codec.encode(moved), schemas.AdmittedRequest) == \
        msgspec.structs.replace(ar, resume_token_ids=resume, migrations=migrations)
