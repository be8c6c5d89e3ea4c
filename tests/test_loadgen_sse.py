"""SSE reading of a recorded /v1/completions stream (the edge's format: token chunks, an
empty end-of-choice chunk with finish_reason, a usage chunk with `choices: []`, [DONE]),
fed whole, byte by byte and in odd slices."""

from __future__ import annotations

import pytest
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.sse import SSEReader
from tokenyard.loadgen.targets import record_sse_payload

HEAD = b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"tokenyard-sim",'
RECORDED = (
    b"data: "
    + HEAD
    + b'"choices":[{"index":0,"text":"He","logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b"data: "
    + HEAD
    + b'"choices":[{"index":0,"text":"ll\xc3\xa9","logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b": keep-alive comment\n\n"
    b"data: "
    + HEAD
    + b'"choices":[{"index":0,"text":"o","logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b"data: "
    + HEAD
    + b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],"usage":null}\n\n'
    b"data: " + HEAD + b'"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,'
    b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)


def read_all(pieces) -> list[str]:
    reader = SSEReader()
    out = [p for piece in pieces for p in reader.feed(piece)]
    return out + reader.close()


def test_whole_stream():
    payloads = read_all([RECORDED])
    assert len(payloads) == 6
    assert payloads[-1] == "[DONE]"
    assert '"text":"llé"' in payloads[1]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 333])
def test_any_split_gives_the_same_events(size):
    pieces = [RECORDED[i : i + size] for i in range(0, len(RECORDED), size)]
    assert read_all(pieces) == read_all([RECORDED])


def test_crlf_multiline_data_fields_and_unterminated_tail():
    stream = b"event: x\r\nid: 3\r\ndata: a\r\ndata:b\r\n\r\n:comment\r\nretry: 5\r\ndata: tail"
    assert read_all([stream]) == ["a\nb", "tail"]
    assert read_all([b"\n\n\n"]) == []


def test_recorded_stream_into_a_record():
    record = RequestRecord(index=0, priority=1, prompt_len=7, send_s=10.0)
    reader = SSEReader()
    ended = False
    # One SSE frame per arrival, arriving at 10.1, 10.2, …
    for i, frame in enumerate(RECORDED.split(b"\n\n")[:-1]):
        for payload in reader.feed(frame + b"\n\n"):
            ended = record_sse_payload(payload, 10.0 + 0.1 * (i + 1), record)
    assert ended
    record.close(99.0)
    assert record.success and record.error is None
    # 3 token chunks (the comment, the empty finish chunk and the usage chunk are not tokens)
    assert record.chunk_s == pytest.approx([10.1, 10.2, 10.4])
    assert record.itl == pytest.approx([0.1, 0.2])
    assert (record.output_tokens, record.prompt_tokens, record.finish_reason) == (3, 7, "length")
    assert record.ttft == pytest.approx(0.1) and record.e2el == pytest.approx(0.4)
    assert record.tpot == pytest.approx(0.15)
    assert record.end_s == pytest.approx(10.7)


def test_error_frame_and_garbage_end_the_stream_as_failures():
    record = RequestRecord(index=0, priority=1, prompt_len=1, send_s=0.0)
    frame = '{"error":{"message":"fleet saturated","type":"server_error","param":null,"code":"overloaded"}}'
    assert record_sse_payload(frame, 1.0, record)
    assert (record.error, record.message, record.end_s) == ("error_overloaded", "fleet saturated", 1.0)

    record = RequestRecord(index=0, priority=1, prompt_len=1, send_s=0.0)
    assert record_sse_payload("{not json", 1.0, record)
    assert record.error == "bad_stream"
