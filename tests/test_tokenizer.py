"""shared.tokenizer: the built-in byte tokenizer, OpenAI content parts, the chat template."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.shared.schemas import ChatMessage
from tokenyard.shared.tokenizer import ByteTokenizer, content_text, load_tokenizer, render_chat


def test_byte_tokenizer_ids_are_utf8_bytes():
    tok = ByteTokenizer()
    assert (tok.name, tok.eos_token_id, tok.vocab_size) == ("bytes", 256, 257)
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.encode("") == []


def test_byte_tokenizer_decode_skips_eos_and_out_of_range_ids():
    tok = ByteTokenizer()
    assert tok.decode([104, 195, 169, 256]) == "hé"
    assert tok.decode([104, -1, 999, 105]) == "hi"


def test_byte_tokenizer_decode_replaces_a_split_character():
    assert ByteTokenizer().decode([195]) == "\ufffd"


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_no_path_loads_the_byte_tokenizer():
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    assert isinstance(load_tokenizer(""), ByteTokenizer)


def test_content_text_accepts_a_string_none_or_text_parts():
    assert content_text("abc") == "abc"
    assert content_text(None) == ""
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    assert content_text([]) == ""


@pytest.mark.parametrize(
    "parts",
    [
        [{"type": "image_url", "image_url": {"url": "x"}}],
        [{"type": "text"}],
        [{"type": "text", "text": 3}],
    ],
)
def test_content_text_refuses_non_text_parts(parts):
    with pytest.raises(ValueError, match="only text content parts are supported"):
        content_text(parts)


def test_render_chat_uses_the_builtin_template():
    messages = [
        ChatMessage("system", "be brief"),
        ChatMessage("user", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        ChatMessage("assistant", None),
    ]
    assert render_chat(messages) == "<|system|>\nbe brief\n<|user|>\nab\n<|assistant|>\n\n<|assistant|>\n"
    assert render_chat([]) == "<|assistant|>\n"
