"""Every decoder on the bus, fuzzed: whatever bytes arrive on a subject, `codec.decode` gives
the message type or raises `codec.DecodeError`, nothing else (no RecursionError from deep
nesting, no OverflowError, no TypeError), in MessagePack and in JSON. Messages are generated
from the schemas themselves (msgspec.inspect), so a new field is fuzzed without a new test.
And what admission takes from anyone, a decoded GenerateRequest, always ends in an answer
that can be sent on."""

from __future__ import annotations

import enum

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.shared import adoption, codec, resume, schemas
from tokenyard.shared import kv_events as kv_events_module
from tokenyard.shared.tokenizer import ByteTokenizer

BUS_TYPES = {
    "submit (admission)": schemas.GenerateRequest,
    "worker offer (worker)": schemas.AdmittedRequest,
    "queue stream (queue), route request (router)": schemas.AdmittedRequestInTransit,
    "route reply (queue)": schemas.RouteDecision,
    "generate reply (router)": schemas.GenerateReply,
    "abort (queue, worker)": schemas.Abort,
    "heartbeat (admission, queue, router, macro)": schemas.Heartbeat,
    "kv events (router)": schemas.KVEventBatch,
    "macro state (router)": schemas.MacroState,
    "worker control (worker)": schemas.WorkerControl,
    "queue state (admission)": schemas.QueueStats,
    "request stream (client, edge)": schemas.StreamEvent,
    "adopt (router)": adoption.AdoptAsk,
    "worker state ask (worker)": adoption.StateAsk,
    "worker state reply (router)": list[adoption.StreamState],
    "adopt reply, adopted reply (worker)": adoption.AdoptReply,
    "router adopted ask (router)": adoption.AdoptedAsk,
    "resume (admission)": resume.ResumeAsk,
    "admission health reply (edge)": schemas.FleetHealth,
}
IDS = list(BUS_TYPES)
TYPES = list(BUS_TYPES.values())
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def builtins_for(t: mi.Type) -> st.SearchStrategy:
    """Builtin values (dicts, lists, scalars) that encode to a valid message of type `t`."""
    match t:
        case mi.IntType():
            lo = t.ge if t.ge is not None else -(2**63)
            hi = t.le if t.le is not None else 2**63 - 1
            return st.integers(lo, hi)
        case mi.FloatType():
            return st.floats(allow_nan=False, allow_infinity=False)
        case mi.StrType():
            return st.text(max_size=12)
        case mi.RawType():  # left encoded by the hop (the prompt's tokens in transit): any value
            return st.lists(st.integers(0, 2**20), max_size=4)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.BytesType():
            return st.binary(max_size=8)
        case mi.ListType():
            return st.lists(builtins_for(t.item_type), max_size=4)
        case mi.DictType():
            keys = st.text(max_size=6) if isinstance(t.key_type, mi.AnyType) else builtins_for(t.key_type)
            return st.dictionaries(keys, builtins_for(t.value_type), max_size=3)
        case mi.UnionType():
            return st.one_of([builtins_for(x) for x in t.types])
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.EnumType():
            return st.sampled_from([e.value for e in t.cls])
        case mi.AnyType():
            return json_values.filter(lambda v: not _has_big_int(v))
        case mi.StructType():
            fields = {f.encode_name: builtins_for(f.type) for f in t.fields if f.required}
            optional = {f.encode_name: builtins_for(f.type) for f in t.fields if not f.required}
            if t.array_like:
                return st.tuples(*[builtins_for(f.type) for f in t.fields]).map(
                    lambda values: ([t.tag] if t.tag is not None else []) + list(values))
            tag = {t.tag_field: st.just(t.tag)} if t.tag is not None else {}
            return st.fixed_dictionaries({**tag, **fields}, optional=optional)
    raise TypeError(f"no strategy for {t!r}")


def _has_big_int(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return not -(2**63) <= v < 2**64
    if isinstance(v, list):
        return any(_has_big_int(x) for x in v)
    if isinstance(v, dict):
        return any(_has_big_int(x) for x in v.values())
    return False


def decodes_cleanly(data: bytes, t, json: bool):
    """The message or None; anything but a DecodeError fails the test."""
    try:
        return codec.decode(data, t, json=json)
    except codec.DecodeError:
        return None


@pytest.mark.parametrize("t", TYPES, ids=IDS)
@FUZZ
@given(data=st.binary(max_size=256))
def test_random_bytes_decode_or_raise_decode_error(t, data):
    decodes_cleanly(data, t, json=False)
    decodes_cleanly(data, t, json=True)


@pytest.mark.parametrize("t", TYPES, ids=IDS)
@FUZZ
@given(data=st.data())
def test_valid_messages_roundtrip_and_their_mutations_fail_cleanly(t, data):
    value = data.draw(builtins_for(mi.type_info(t)))
    for json, enc in ((False, msgspec.msgpack.encode), (True, msgspec.json.encode)):
        raw = enc(value)
        msg = codec.decode(raw, t, json=json)  # a message built from the schema is accepted
        assert codec.decode(codec.encode(msg, json=json), t, json=json) == msg
        cut = data.draw(st.integers(0, len(raw)))
        flip = data.draw(st.integers(0, max(0, len(raw) - 1)))
        byte = data.draw(st.integers(0, 255))
        decodes_cleanly(raw[:cut], t, json)
        decodes_cleanly(raw[:flip] + bytes([byte]) + raw[flip + 1:], t, json)


@pytest.mark.parametrize("t", TYPES, ids=IDS)
@FUZZ
@given(value=json_values)
def test_structured_garbage_decodes_to_a_message_that_can_be_sent_on(t, value):
    """JSON of any shape, integers past 64 bits included: refused, or decoded into a message
    that re-encodes as MessagePack (what every hop sends on). GenerateRequest's free-form
    chat content is the one place a too-large integer can hide; the next test covers it."""
    msg = decodes_cleanly(msgspec.json.encode(value), t, json=True)
    if msg is not None and t is not schemas.GenerateRequest:
        codec.encode(msg)


@pytest.mark.parametrize("t", TYPES, ids=IDS)
@pytest.mark.parametrize("json", [False, True], ids=["msgpack", "json"])
def test_nesting_200k_deep_is_a_decode_error(t, json):
    deep = b"[" * 200_000 + b"]" * 200_000 if json else b"\x91" * 200_000 + b"\xc0"
    with pytest.raises(codec.DecodeError):
        codec.decode(deep, t, json=json)
    wrapped = b'{"prompt": "a", "x": ' + deep + b"}" if json else b"\x81\xa1x" + deep
    decodes_cleanly(wrapped, t, json)  # inside an unknown field: skipped or refused, never a crash


ADMISSION = AdmissionCore(AdmissionConfig(), ByteTokenizer())
request_fields = builtins_for(mi.type_info(schemas.GenerateRequest))


@FUZZ
@given(value=st.one_of(request_fields, json_values), headers=st.dictionaries(
    st.sampled_from(["x-request-tier", "x-tenant", "x-api-key"]), st.text(max_size=6), max_size=3))
def test_admission_answers_any_decoded_request_with_something_it_can_send(value, headers):
    req = decodes_cleanly(msgspec.json.encode(value), schemas.GenerateRequest, json=True)
    if req is None:
        return
    verdict = ADMISSION.admit(req, reply_to="_INBOX.x", json=True, headers=headers, now=1.0, new_id="n")
    assert isinstance(verdict, schemas.AdmittedRequest | schemas.Rejected)
    codec.encode(verdict)
    if isinstance(verdict, schemas.Rejected):
        assert 400 <= verdict.status < 500 or verdict.status == 503


def test_the_list_names_every_message_a_shell_decodes():
    """A new Struct on the bus must join BUS_TYPES (the messages of shared/schemas.py,
    shared/kv_events.py, shared/adoption.py and shared/resume.py, less those only nested inside others)."""
    nested_only = {schemas.ChatMessage, schemas.StreamOptions, schemas.Usage, schemas.Sampling, schemas.EngineStats,
                   schemas.VllmSampling}  # (the base of GenerateRequest and Sampling, never on the bus alone)
    tops = {v for m in (schemas, kv_events_module, adoption, resume) for v in vars(m).values()
            if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == m.__name__}
    kv_events = {schemas.KVCacheEvent, schemas.BlockStored, schemas.BlockRemoved, schemas.AllBlocksCleared}
    events = {schemas.Accepted, schemas.Rejected, schemas.Chunk, schemas.Finished, schemas.Error}
    replies = {adoption.StreamState}  # a list of them: the state reply
    covered = {t for t in TYPES if isinstance(t, type)} | events | kv_events | nested_only | replies
    assert tops - covered == set()
    assert not any(isinstance(t, type) and issubclass(t, enum.Enum) for t in TYPES)
