"""`tokenyard request`: one request over NATS, its stream printed as it comes (text on stdout,
a summary on stderr; or every event as a JSON line), refusals and bad arguments as one-line
errors with a non-zero exit."""

from __future__ import annotations

import io
import json

import pytest

from tokenyard import request
from tokenyard.cli import build_parser


def args(*argv: str):
    return build_parser().parse_args(["request", *argv])


@pytest.mark.e2e
async def test_text_streams_to_stdout_and_a_summary_to_stderr(fleet):
    out, err = io.StringIO(), io.StringIO()
    assert await request.run(args("Hello", "--nats", fleet.nats_url, "--max-tokens", "4"), out, err) == 0
    assert out.getvalue().endswith("\n") and len(out.getvalue()) == 5  # 4 one-byte tokens, then a newline
    assert err.getvalue().startswith("[length: 4 tokens for a 5-token prompt (0 cached) on worker tw")


@pytest.mark.e2e
async def test_events_are_json_lines_in_order(fleet):
    out = io.StringIO()
    assert await request.run(args("Hi", "--nats", fleet.nats_url, "--max-tokens", "3", "--events", "--chat"), out) == 0
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["type"] for e in events] == ["accepted", "chunk", "chunk", "chunk", "finished"]
    assert [e["seq"] for e in events[1:]] == [0, 1, 2, 3]
    assert events[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.e2e
async def test_a_refusal_is_one_line_and_exit_1(fleet):
    err = io.StringIO()
    assert await request.run(args("Hi", "--nats", fleet.nats_url, "--model", "no-such-model"), io.StringIO(), err) == 1
    assert err.getvalue().startswith("tokenyard request: 404 ") and "no-such-model" in err.getvalue()


def test_bad_arguments_are_an_error_not_a_traceback(capsys):
    assert request.main(args("Hi", "--max-tokens", "0")) == 2
    assert capsys.readouterr().err == "tokenyard request: error: --max-tokens must be at least 1\n"
