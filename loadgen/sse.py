"""An incremental Server-Sent Events reader: bytes in as they arrive off the socket (split
anywhere, even inside a UTF-8 character or a line ending), the `data` payload of each
complete event out.

Per the SSE spec: lines end in LF or CRLF; a blank line ends an event; an event's `data:`
lines are joined by LF; one space after the colon is dropped; lines starting with `:` are
comments; other fields (`event`, `id`, `retry`) are ignored here. OpenAI-style streams put
one JSON object per event and end with `data: [DONE]`.
"""

from __future__ import annotations


class SSEReader:
    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The payloads of the events `chunk` completes, in order."""
        self._buf += chunk
        out: list[str] = []
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data).decode("utf-8"))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return out

    def close(self) -> list[str]:
        """An event the server left unterminated at the end of the stream (lenient: the spec
        would drop it, but some servers omit the final blank line)."""
        out = self.feed(b"\n\n") if self._buf or self._data else []
        self._buf, self._data = b"", []
        return out
