"""Server-sent events passed through whole: forward each complete event as soon as it is complete.

Forwarding only up to the last event boundary costs one ``rfind`` per chunk and buys two things:
a failure mid-stream can append a clean error event (never one glued to half an event), and the
concatenation of what is forwarded is byte-identical to what the replica sent.
"""

from __future__ import annotations

import json

#: The event the gateway appends when a replica fails after the stream has started.
def error_event(message: str, code: int = 502) -> bytes:
    """An OpenAI-style SSE error event (the ``openai`` client raises ``APIError`` on it)."""
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class SSEFramer:
    """Splits a byte stream at SSE event boundaries (a blank line, LF or CRLF)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """Add ``chunk``; return every complete event received so far (possibly ``b""``)."""
        data = self._pending + chunk if self._pending else chunk
        lf = data.rfind(b"\n\n")
        crlf = data.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        self._pending = data[cut:]
        return data[:cut] if cut < len(data) else data

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet complete."""
        return self._pending


#: Byte patterns of a non-empty token in an event (chat ``delta.content``, completion ``text``),
#: compact and spaced JSON; each minus its empty-string form.
_TOKEN_PATTERNS = ((b'"content":"', b'"content":""'), (b'"content": "', b'"content": ""'),
                   (b'"text":"', b'"text":""'), (b'"text": "', b'"text": ""'))


class StreamUsage:
    """Token counts of one stream: from a ``usage`` object when the stream carries one, else
    counted as content chunks (vLLM sends one token per chunk)."""

    __slots__ = ("usage", "chunks", "count_chunks")

    def __init__(self, count_chunks: bool) -> None:
        self.usage: dict | None = None
        self.chunks = 0
        self.count_chunks = count_chunks

    def observe(self, block: bytes) -> None:
        """Look at a block of complete events."""
        if self.count_chunks:
            # Counted on the bytes, not by parsing each event: JSON-decoding every chunk was the
            # largest cost of a streamed token in the gateway (bench/results/gateway_stream.md).
            for token, empty in _TOKEN_PATTERNS:
                found = block.count(token)
                if found:
                    self.chunks += found - block.count(empty)
        if b'"usage"' not in block:
            return
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n")
        for event in block.split(b"\n\n"):
            event = event.strip()
            if not event.startswith(b"data:") or b'"usage"' not in event:
                continue
            try:
                obj = json.loads(event[5:].strip())
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                self.usage = obj["usage"]
