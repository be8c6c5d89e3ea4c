"""Tokenizers: the served model's (a Hugging Face `tokenizer.json`, when configured) or a
built-in deterministic byte tokenizer (token id = UTF-8 byte, EOS = 256), which needs no
files and round-trips any text exactly. Admission tokenizes once; later hops reuse the ids.

Chat messages are rendered with a plain built-in template

    <|role|>\\ncontent\\n … <|assistant|>\\n

(a model's own Jinja chat template is applied by the vLLM engine path, issue 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tokenyard.shared.schemas import ChatMessage


class Tokenizer(Protocol):
    name: str
    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0–255; 256 is end-of-sequence."""

    name = "bytes"
    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers` tokenizer loaded from a local `tokenizer.json` (or a folder holding it)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as _Tok  # optional dependency: the `hf` extra

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        self._tok = _Tok.from_file(str(file))
        self.name = str(p)
        self.vocab_size = self._tok.get_vocab_size()
        eos = None
        for candidate in ("</s>", "<|endoftext|>", "<|eot_id|>", "<eos>"):
            eos = self._tok.token_to_id(candidate)
            if eos is not None:
                break
        self.eos_token_id = eos if eos is not None else self.vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


def load_tokenizer(path: str | None) -> Tokenizer:
    return HFTokenizer(path) if path else ByteTokenizer()


def content_text(content: str | list[dict] | None) -> str:
    """OpenAI message content: a string, or a list of parts of which the text ones count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError("only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def render_chat(messages: Sequence[ChatMessage]) -> str:
    out = [f"<|{m.role}|>\n{content_text(m.content)}\n" for m in messages]
    out.append("<|assistant|>\n")
    return "".join(out)
